"""The ``download`` stage: one task from its source into canonical parquet files.

Outputs ``train``, ``selection`` (carved from train, used for every choice the pipeline
makes) and the task's evaluation splits (reported, never used for choices).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.data.glue_files import locate, parse_split
from bertvision.data.hub import load_hub_split
from bertvision.io import atomic_write_parquet
from bertvision.tasks import TaskSpec, splits_of

log = logging.getLogger(__name__)


def load_source_split(task: TaskSpec, split: str, source: dict) -> pd.DataFrame:
    if source["source"] == "local":
        path = locate(Path(source["glue_dir"]), task, split)
        log.info("reading %s", path)
        return parse_split(path, task, split)
    if source["source"] == "hub":
        return load_hub_split(task, split, repo=source.get("hub_repo"))
    raise ValueError(f"data.source must be 'local' or 'hub', got {source['source']!r}")


def subsample(df: pd.DataFrame, size: int | None, seed: int) -> pd.DataFrame:
    """A seeded random subset of ``size`` rows, kept in file order; all rows when ``size`` is None."""
    if size is None or size >= len(df):
        return df
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(df), size=size, replace=False))
    return df.iloc[keep].reset_index(drop=True)


def carve_selection(df: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split ``df`` into (train, selection) with ``round(fraction * n)`` selection rows (at least 1)."""
    n_sel = max(1, int(round(fraction * len(df))))
    if n_sel >= len(df):
        raise ValueError(f"selection_fraction {fraction} leaves no training rows out of {len(df)}")
    rng = np.random.default_rng(seed + 1)
    is_sel = np.zeros(len(df), dtype=bool)
    is_sel[rng.choice(len(df), size=n_sel, replace=False)] = True
    return df[~is_sel].reset_index(drop=True), df[is_sel].reset_index(drop=True)


def download_task(task: TaskSpec, settings: dict, out_dir: Path) -> dict[str, int]:
    """Write ``{out_dir}/{split}.parquet`` for every split; return the row counts.

    ``settings``: source, glue_dir, hub_repo, seed, selection_fraction, train_size, eval_size.
    """
    seed = int(settings["seed"])
    train_full = load_source_split(task, "train", settings)
    train_pool = subsample(train_full, settings.get("train_size"), seed)
    train, selection = carve_selection(train_pool, float(settings["selection_fraction"]), seed)
    frames = {"train": train, "selection": selection}
    for split in task.eval_splits:
        frames[split] = subsample(load_source_split(task, split, settings), settings.get("eval_size"), seed)
    counts = {}
    out_dir = Path(out_dir)
    for split in splits_of(task):
        atomic_write_parquet(frames[split], out_dir / f"{split}.parquet")
        counts[split] = len(frames[split])
    log.info("%s: source train rows %d; written %s", task.name, len(train_full), counts)
    return counts
