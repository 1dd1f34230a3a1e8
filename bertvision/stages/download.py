"""The ``download`` stage: one task from its source into canonical parquet files.

Outputs ``train``, ``selection`` (carved from train, used for every choice the pipeline
makes) and the task's evaluation splits (reported, never used for choices).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.config.settings import DownloadSettings
from bertvision.data import squad_files
from bertvision.data.glue_files import locate, parse_split
from bertvision.data.hub import (
    declared_source,
    load_declared_questions,
    load_declared_split,
    load_hub_questions,
    load_hub_split,
)
from bertvision.data.task_files import (
    CONSTANT_LABELS_REFUSED,
    absent_labels_note,
    read_task_file,
    read_unlabelled,
    repeated_rows,
    repeats_note,
)
from bertvision.errors import DataFormatError
from bertvision.files import atomic_write_json, atomic_write_parquet
from bertvision.layout import rows_record, split_file
from bertvision.registry.task_spec import TaskSpec, splits_of

log = logging.getLogger(__name__)


def load_source_split(task: TaskSpec, split: str, source: DownloadSettings) -> pd.DataFrame:
    if task.hub:  # a task of the config's own from the hub: its dataset, whatever data.source says
        log.info("loading %s", declared_source(task, split))
        return load_declared_split(task, split)
    if task.files:  # a task of the config's own: its files, whatever data.source says
        path, layout = Path(task.files.files[split]), task.files
        log.info("reading %s", path)
        return read_task_file(path, split, layout.text_columns, task.text_fields, layout.label_column, task.kind,
                              task.raw_labels)  # fmt: skip
    if source.source == "local":
        path = locate(source.folder("glue_dir"), task, split)
        log.info("reading %s", path)
        return parse_split(path, task, split)
    if source.source == "hub":
        return load_hub_split(task, split, source.hub_repo)
    raise ValueError(f"data.source must be 'local' or 'hub', got {source.source!r}")


def subsample(df: pd.DataFrame, size: int | None, seed: int) -> pd.DataFrame:
    """A seeded random subset of ``size`` rows, kept in file order; all rows when ``size`` is None."""
    if size is None or size >= len(df):
        return df
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(df), size=size, replace=False))
    return df.iloc[keep].reset_index(drop=True)


def draw(df: pd.DataFrame, size: int | None, seed: int, key: str, split: str) -> tuple[pd.DataFrame, dict]:
    """``subsample`` and its record (the rows drawn, of how many, and the ``size`` the config key
    ``key`` asked); a size larger than the split is one warning: all its rows are drawn."""
    if size is not None and size > len(df):
        log.warning("%s: %d rows asked, but the %s split has %d: all %d drawn", key, size, split, len(df), len(df))
    drawn = subsample(df, size, seed)
    return drawn, {"rows": len(drawn), "of": len(df), "asked": size}


def carve_selection(df: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split ``df`` into (train, selection) with ``round(fraction * n)`` selection rows (at least 1)."""
    n_sel = max(1, int(round(fraction * len(df))))
    if n_sel >= len(df):
        raise ValueError(f"selection_fraction {fraction} leaves no training rows out of {len(df)}")
    rng = np.random.default_rng(seed + 1)
    is_sel = np.zeros(len(df), dtype=bool)
    is_sel[rng.choice(len(df), size=n_sel, replace=False)] = True
    return df[~is_sel].reset_index(drop=True), df[is_sel].reset_index(drop=True)


def write_splits(task: TaskSpec, frames: dict[str, pd.DataFrame], out_dir: Path) -> dict[str, int]:
    counts = {}
    for split in splits_of(task):
        atomic_write_parquet(frames[split], split_file(out_dir, split))
        counts[split] = len(frames[split])
    return counts


def load_squad_split(task: TaskSpec, split: str, settings: DownloadSettings) -> tuple[pd.DataFrame, str]:
    """A question task's ``split`` and where it was read, as messages name it."""
    if task.hub:  # a question task of the config's own from the hub, whatever data.source says
        log.info("loading %s", declared_source(task, split))
        return load_declared_questions(task, split), declared_source(task, split)
    if task.files or settings.source == "local":  # a question task of the config's own: its paths as given
        path = squad_files.locate(Path("") if task.files else settings.folder("squad_dir"), task.squad.files, split)
        log.info("reading %s", path)
        return squad_files.parse_squad(path), str(path)
    frame = load_hub_questions(task, split, settings.hub_repo)
    return frame, f"{settings.hub_repo or task.hub_id} split {task.hub_splits[split]}"


def download_squad(task: TaskSpec, settings: DownloadSettings, out_dir: Path) -> tuple[dict[str, int], dict, dict]:
    """Question answering: parts are split by article, so no context is shared between the
    train, selection and evaluation questions. With ``article_split`` every part comes from
    one source file (offline we only have the dev file). ``train_size`` then draws questions
    from the train part, after the article split."""
    seed, article_split = int(settings.seed), settings.article_split
    if article_split:
        source, where = load_squad_split(task, article_split["from"], settings)
        shares, key = {k: article_split[k] for k in ("selection", "dev")}, f"tasks.{task.name}.article_split"
    else:
        source, where = load_squad_split(task, "train", settings)
        shares, key = {"selection": float(settings.selection_fraction)}, "data.selection_fraction"
    parts = squad_files.split_by_article(source, shares, seed, where, key)
    if not article_split:
        parts["dev"] = load_squad_split(task, "dev", settings)[0]
    frames, drawn = {}, {}
    for split, size in {"train": "train_size", "selection": "selection_size", "dev": "eval_size"}.items():
        key = f"tasks.{task.name}.{size}"
        frames[split], drawn[split] = draw(parts[split], getattr(settings, size), seed, key, split)
    drawn["train"]["before_selection"] = False  # drawn from the train articles the selection split left
    counts = write_splits(task, frames, out_dir)
    log.info(
        "%s: questions written %s (articles: %s)",
        task.name,
        counts,
        {k: int(v["title"].nunique()) for k, v in frames.items()},
    )
    return counts, {}, drawn


def download_glue(
    task: TaskSpec, settings: DownloadSettings, out_dir: Path
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    seed = int(settings.seed)
    train_full = load_source_split(task, "train", settings)
    train_pool, drawn_train = draw(train_full, settings.train_size, seed, f"tasks.{task.name}.train_size", "train")
    where = task.files.files["train"] if task.files else _train_source(task)
    try:
        train, selection = carve_selection(train_pool, float(settings.selection_fraction), seed)
    except ValueError as err:
        raise DataFormatError(f"{where}: {len(train_pool)} rows: too few for a selection split ({err})") from None
    check_train_labels(task, train, where)
    if task.kind == "classification" and (absent := absent_labels_note(train, task.label_names)):
        log.warning("%s: %s", task.name, absent)
    frames, drawn = {"train": train}, {"train": {**drawn_train, "before_selection": True}}
    size_key = f"tasks.{task.name}.selection_size"
    frames["selection"], drawn["selection"] = draw(selection, settings.selection_size, seed, size_key, "selection")
    check_selection_labels(task, frames["selection"], where)
    for split in task.eval_splits:
        full = load_source_split(task, split, settings)
        frames[split], drawn[split] = draw(full, settings.eval_size, seed, f"tasks.{task.name}.eval_size", split)
    if task.unlabelled_file:  # checked here, before the run goes on; read by the predict job, its only reader
        log.info("checking %s (unlabelled: predicted, never scored)", task.unlabelled_file)
        read_unlabelled(task)
    counts = write_splits(task, frames, out_dir)
    log.info("%s: source train rows %d; written %s", task.name, len(train_full), counts)
    repeated = {}
    for split in ("selection", *task.eval_splits):  # dev against every train row read, selection or not
        seen = train if split == "selection" else train_pool
        repeated[split] = repeated_rows(seen, frames[split], task.text_fields)
        if note := repeats_note(repeated[split], len(frames[split]), split):
            log.warning("%s: %s", task.name, note)
    return counts, repeated, drawn


def check_train_labels(task: TaskSpec, train: pd.DataFrame, where: str) -> None:
    """The train split left after subsampling and the selection carve still has labels to learn
    from: two classes at least, or regression labels that vary."""
    present = sorted(set(train["label"].tolist()))
    if len(present) > 1:
        return
    shown = task.label_names[present[0]] if task.kind == "classification" else present[0]
    raise DataFormatError(
        f"{where}: the {len(train)} train rows left after tasks.{task.name}.train_size and the selection split "
        f"(data.selection_fraction, data.seed) all have label {shown!r}: nothing to learn; give more rows "
        "of the other labels"
    )


def check_selection_labels(task: TaskSpec, selection: pd.DataFrame, where: str) -> None:
    """A regression's selection split has labels that vary: every choice is made on its Pearson
    correlation, undefined (every method 0) on one row or one value."""
    if task.kind != "regression" or len(set(selection["label"].tolist())) > 1:
        return
    raise DataFormatError(
        f"{where}: the {len(selection)} selection row(s) carved from train (data.selection_fraction, "
        f"tasks.{task.name}.selection_size) all have label {selection['label'].iloc[0]:g}: "
        f"{CONSTANT_LABELS_REFUSED['dev']}, and every choice is made on them; give more rows or a larger share"
    )


def _train_source(task: TaskSpec) -> str:
    return declared_source(task, "train") if task.hub else f"{task.name} train"


def download_task(task: TaskSpec, settings: DownloadSettings, out_dir: Path) -> dict[str, int]:
    """Write ``{out_dir}/{split}.parquet`` for every split and their record (``layout.rows_record``:
    each split's rows and, but for question tasks, whose splits are cut by article, how many repeat
    a train row's texts; and each split's draw (``draw``): train's before the selection split is
    carved, a question task's after the article split, ``before_selection`` says which); return the
    row counts."""
    counts, repeated, drawn = (download_squad if task.squad else download_glue)(task, settings, out_dir)
    record = {"task": task.name, "rows": counts, "repeated": repeated, "drawn": drawn}
    atomic_write_json(record, rows_record(out_dir))
    return counts
