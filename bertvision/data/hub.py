"""Load a task split from the Hugging Face hub (or a local dataset repository with the same
layout, which is how the tests exercise this path offline): a registered GLUE task's, or one of a
task the config declares from the hub (``tasks.<name>.hub``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.data import squad_files
from bertvision.data.glue_files import canonical_frame
from bertvision.data.task_files import task_frame
from bertvision.data.text import readable
from bertvision.errors import DataFormatError, MissingError
from bertvision.registry.task_spec import TaskSpec


def hub_dataset(repo: str, *args, **kwargs):
    """``datasets.load_dataset(repo, ...)``; a dataset that cannot be had (no network and not in the
    cache, an unknown id, config or split) one line naming it, not datasets' traceback."""
    import datasets
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return datasets.load_dataset(repo, *args, **kwargs)
    except (OSError, ValueError, HfHubHTTPError) as err:
        reason = " ".join(str(err).split())
        config = f", config {args[0]}" if args and args[0] else ""
        where = f"split {kwargs.get('split')}{config}"
        if os.path.isdir(repo):  # a local dataset: no network to advise, the split or config is the matter
            if kwargs.get("split") in _split_names(repo, *args[:1]):  # datasets refuses a split of no rows
                raise DataFormatError(f"{repo} ({where}): no rows") from None
            raise MissingError(f"{repo} ({where}): not in this dataset ({reason})") from None
        raise MissingError(
            f"{repo} (split {kwargs.get('split')}): no dataset from the hub or its cache ({reason}); without "
            "network, run the download jobs once where the hub answers (snakemake --until download), or read "
            "local files (data.source: local, or the task's own files); a local dataset folder is read relative "
            f"to the working directory ({Path.cwd()})"
        ) from None


def _split_names(folder: str, config: str | None = None) -> list[str]:
    """The splits a local dataset ``folder`` declares, or none where that cannot be read either."""
    import datasets

    try:
        return datasets.get_dataset_split_names(folder, config)
    except Exception:  # noqa: BLE001 - any failure here leaves the caller's own message
        return []


def hub_rows(repo: str, *args, named_by: str = "", **kwargs) -> tuple[pd.DataFrame, dict]:
    """The rows and the features (column -> ``datasets`` feature) of ``hub_dataset(repo, ...)``;
    ``named_by``: the config key that gives ``repo``, which an error names first."""
    # datasets caches a local directory by its name and file patterns, not by what its files hold
    # (a changed directory would be read from the old one's cache): one gets a cache of its own
    local = os.path.isdir(repo)
    with tempfile.TemporaryDirectory(prefix="bertvision-hub-") if local else contextlib.nullcontext() as cache:
        try:
            dataset = hub_dataset(repo, *args, cache_dir=cache, **kwargs)
        except MissingError as err:
            raise MissingError(f"{named_by}: {err}" if named_by else str(err)) from None
        return dataset.to_pandas(), dict(dataset.features)


def hub_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is no hub id (a space, an empty part, a path), in huggingface_hub's words;
    None where it is one. A backbone's or a dataset's download would fail on it after the jobs
    before it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        return str(err)
    return None


def dataset_problem(repo: str) -> str | None:
    """Why ``repo`` is neither a local dataset folder nor a hub id; None where it is one."""
    problem = None if os.path.isdir(repo) else hub_id_problem(repo)
    return f"{repo}: neither a local folder nor a hub id ({problem})" if problem else None


def local_dataset_files(repo: str) -> list[Path]:
    """The files of a local dataset directory (none for a hub id), hidden ones left out as
    ``datasets`` leaves them, so that an edited file reruns the download that reads it."""
    if not os.path.isdir(repo):
        return []
    files = (path for path in sorted(Path(repo).rglob("*")) if path.is_file())
    return [path for path in files if not any(part.startswith(".") for part in path.relative_to(repo).parts)]


def load_hub_split(task: TaskSpec, split: str, given: str | None = None) -> pd.DataFrame:
    """A split of a registered GLUE task from the hub: its registry entry's dataset, or ``given`` (data.hub_repo)."""
    repo, hub_split, key = given or task.hub_id, task.hub_splits[split], "data.hub_repo" if given else ""
    df, _ = hub_rows(repo, task.hub_config, split=hub_split, named_by=key)
    where = (f"{key}: " if key else "") + f"{repo}/{task.hub_config} split {hub_split}"
    # nyu-mll/glue names its columns as our canonical text fields.
    missing = [c for c in (*task.text_fields, "label") if c not in df.columns]
    if missing:
        raise DataFormatError(f"{where}: missing column(s) {missing}; has {list(df.columns)}")
    if task.kind == "classification":
        bad = ~df["label"].between(0, task.num_labels - 1)
        if bad.any():
            row = int(bad.idxmax())
            raise DataFormatError(
                f"{where}: row {row}: label {df['label'].iloc[row]} outside 0..{task.num_labels - 1} "
                "(GLUE test splits have no labels)"
            )
    for name in task.text_fields:
        empty = df[name].isna() | ~df[name].astype(str).map(readable)
        if empty.any():
            raise DataFormatError(f"{where}: row {int(empty.idxmax())}: empty text in column {name!r}")
    df["idx"] = df["idx"] if "idx" in df.columns else range(len(df))
    return canonical_frame(df, task)


# --- tasks of the config's own (tasks.<name>.hub) -------------------------------------------------
SQUAD_COLUMNS = ("id", "title", "context", "question", "answers")  # rajpurkar/squad_v2's


def declared_source(task: TaskSpec, split: str) -> str:
    """A declared hub task's split as error messages name it: ``<id>[/<config>] split <hub split>``."""
    dataset = f"{task.hub_id}/{task.hub_config}" if task.hub_config else task.hub_id
    return f"{dataset} split {task.hub_splits[split]}"


def load_declared_rows(task: TaskSpec, split: str) -> tuple[pd.DataFrame, dict]:
    """The rows and the features (column -> ``datasets`` feature) of our ``split`` of a task
    declared from the hub, at its revision; a DataFormatError when the split has no rows."""
    frame, features = hub_rows(task.hub_id, task.hub_config or None, split=task.hub_splits[split],
                               revision=task.hub.revision)  # fmt: skip
    if len(frame) == 0:
        raise DataFormatError(f"{declared_source(task, split)}: no rows")
    return frame, features


def load_declared_split(task: TaskSpec, split: str) -> pd.DataFrame:
    """Canonical frame of a split of a classification or regression task declared from the hub,
    checked row by row as a declared file is (``task_frame``): every row kept or the split refused."""
    frame, features = load_declared_rows(task, split)
    source, layout = declared_source(task, split), task.hub
    if task.kind == "classification" and layout.label_column in frame.columns:
        feature = features.get(layout.label_column)
        frame[layout.label_column] = _label_names(frame[layout.label_column], feature, task, source)
    return task_frame(frame, source, lambda row: f"row {row}", split, layout.text_columns, task.text_fields,
                      layout.label_column, task.kind, task.raw_labels)  # fmt: skip


def load_declared_questions(task: TaskSpec, split: str) -> pd.DataFrame:
    """A split of a span or answerability task declared from the hub: squad_v2-shaped rows in
    ``squad_files``' columns."""
    return questions(load_declared_rows(task, split)[0], declared_source(task, split))


def load_hub_questions(task: TaskSpec, split: str, given: str | None) -> pd.DataFrame:
    """A split of a registered question task (SQuAD 2.0) from the hub: its registry entry's
    dataset, or ``given`` (data.hub_repo, which every registered task then reads)."""
    dataset, hub_split, key = given or task.hub_id, task.hub_splits[split], "data.hub_repo" if given else ""
    frame, _ = hub_rows(dataset, split=hub_split, named_by=key)
    return questions(frame, (f"{key}: " if key else "") + f"{dataset} split {hub_split}")


def questions(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """squad_v2-shaped rows in ``squad_files``' columns; a DataFormatError naming ``source`` when a column lacks."""
    missing = [column for column in SQUAD_COLUMNS if column not in frame.columns]
    if missing:
        raise DataFormatError(
            f"{source}: missing column(s) {missing} of a squad_v2-shaped dataset; columns found: {list(frame.columns)}"
        )
    return squad_files.from_hub_records(frame, source)


def _label_names(values: pd.Series, feature, task: TaskSpec, source: str) -> pd.Series:
    """A ClassLabel column's ids as its names, which must be the declared labels in their order;
    any other column (integers, strings) as it is, its values matched as strings."""
    import datasets

    if not isinstance(feature, datasets.ClassLabel):
        return values
    names, declared = [str(name) for name in feature.names], list(task.raw_labels)
    if names != declared:
        raise DataFormatError(
            f"{source}: column {task.hub.label_column!r}: the dataset's ClassLabel names {names} "
            f"are not tasks.{task.name}.labels {declared} (the same labels in the same order)"
        )
    # an id outside the names (-1: no label) stays as it is, for task_frame to name its row
    return values.map(lambda v: names[v] if isinstance(v, int | np.integer) and 0 <= v < len(names) else v)
