"""The whole cost of a pick: the seconds of everything that had to run before the pick could be
made, per fine-tuning seed (a head path's own seconds count only the path itself).

The summary picks its BERTVision path among every head and head + BERT ensemble on every
checkpoint by mean selection score. Making that pick took, per fine-tuning seed:

- the fine-tuning to the largest checkpoint with heads (one run passes every smaller checkpoint
  on its way there; its ``train_seconds`` at that checkpoint);
- the extraction of every checkpoint's features (the extract jobs' wall time; none for streamed
  states, whose encoder passes are in the heads' seconds);
- every head and head seed trained on every checkpoint (each record's ``seconds``; streamed, its
  own work plus an even share of its job's encoder passes, so the records of one job add up to
  that job's work and no pass is counted twice);
- every search trial (the wall time of the search worker jobs of every searched head).

Choosing among the heads of one checkpoint only (the frozen encoder's best head) costs the same
sum at that checkpoint; a pick within a budget (every checkpoint of at most c epochs), the sum
over those checkpoints with the fine-tuning to c. BERT's own head at a checkpoint chooses nothing: its whole cost is its
fine-tuning to the checkpoint. Full fine-tuning's whole cost is every epoch it trained
(``train_seconds_all_epochs``), since the kept epoch is only known after all of them. The
encoders' evaluations (full fine-tuning's selection scoring after each epoch, the checkpoints'
own scoring) are not recorded as time and are left out on both sides. Data-fraction and
transfer experiments and shared encoders do not take part in the pick and are left out."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from bertvision.layout import Checkpoint, Job, source_checkpoint
from bertvision.reporting.timing import read_benchmark

# One fine-tuning run: the unit whose whole cost is summed.
SEED_KEYS = ["backbone", "task", "ft_seed"]
CHECKPOINT_KEYS = [*SEED_KEYS, "epoch_fraction"]
# Per trained head and seed, what the sums read (head_s: its record's seconds; the others are
# the same for every head seed: fine-tuning to its checkpoint, the checkpoint's extraction, and
# the head's own search, 0 when it was not searched).
HEAD_RUN_COLUMNS = [*CHECKPOINT_KEYS, "model", "finetune_s", "extract_s", "head_s", "search_s"]
PARTS = ["finetune_s", "extract_s", "heads_s", "search_s"]


def search_worker_jobs(worker_records: Iterable[dict]) -> list[Job]:
    """The search worker jobs behind these worker records (each carries its study's keys and
    its worker number), whose benchmark files hold their wall time."""
    return [
        Job("search_worker", {**w["keys"], "frac": Checkpoint.named(w["keys"]["frac"]), "worker": w["worker"]})
        for w in worker_records
    ]


def search_seconds(jobs: Iterable[Job]) -> dict[tuple, float]:
    """(model, task, ft seed, checkpoint, head) -> wall seconds of its study's worker jobs."""
    out: dict[tuple, float] = {}
    for job in jobs:
        if job.rule == "search_worker":
            k = job.keys
            key = (k["model"], k["task"], int(k["ftseed"]), k["frac"], k["head"])
            out[key] = out.get(key, 0.0) + read_benchmark(job)["seconds"]
    return out


def head_search_seconds(record: dict, search: dict[tuple, float]) -> float:
    """The search behind one head record: 0 when the head was not searched, NaN when it was but
    its workers' times are missing (never silently 0)."""
    if not record.get("search"):
        return 0.0
    src = record["source"]
    key = (src["model"], record["task"], int(src["ft_seed"]), source_checkpoint(record), record["head"])
    return search.get(key, np.nan)


def all_epochs_seconds(record: dict) -> float:
    """Full fine-tuning's training seconds over every epoch it trained (records from before
    ``train_seconds_all_epochs``: its history's last epoch; NaN without a history)."""
    if "train_seconds_all_epochs" in record:
        return float(record["train_seconds_all_epochs"])
    history = record.get("history") or []
    return float(history[-1]["train_seconds"]) if history else np.nan


def checkpoint_spend(head_runs: pd.DataFrame) -> pd.DataFrame:
    """One row per fine-tuning run and checkpoint, from one row per trained head and seed
    (HEAD_RUN_COLUMNS): the fine-tuning to the checkpoint, its extraction, every head and seed's
    seconds, every searched head's study, and their sum ``whole_s``."""
    if head_runs.empty:
        return pd.DataFrame(columns=[*CHECKPOINT_KEYS, *PARTS, "head_runs", "whole_s"])
    g = head_runs.groupby(CHECKPOINT_KEYS, sort=True)
    out = g.agg(
        finetune_s=("finetune_s", "first"),
        extract_s=("extract_s", "first"),
        heads_s=("head_s", lambda v: v.sum(skipna=False)),
        head_runs=("head_s", "size"),
    )
    studies = head_runs.groupby([*CHECKPOINT_KEYS, "model"], sort=True)["search_s"].first()
    out["search_s"] = studies.groupby(CHECKPOINT_KEYS).agg(lambda v: v.sum(skipna=False))
    out["whole_s"] = out[PARTS].sum(axis=1, skipna=False)
    return out.reset_index()


def selection_spend(checkpoints: pd.DataFrame, up_to: float = np.inf) -> pd.DataFrame:
    """One row per fine-tuning run: the whole cost of a pick among every checkpoint of at most
    ``up_to`` epochs (fine-tuning to the largest of them, their extraction, heads and searches)."""
    rows = []
    for key, g in checkpoints[checkpoints["epoch_fraction"] <= up_to].groupby(SEED_KEYS, sort=True):
        last = g.loc[g["epoch_fraction"].idxmax()]
        row = dict(zip(SEED_KEYS, key))
        row["finetune_s"] = last["finetune_s"]
        row.update({part: g[part].sum(skipna=False) for part in PARTS[1:]})
        row["whole_s"] = sum(row[part] for part in PARTS)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*SEED_KEYS, *PARTS, "whole_s"])


def mean_std(values: pd.Series) -> tuple[float, float]:
    """Mean and sample std over fine-tuning seeds (std NaN for one seed; both NaN for none)."""
    values = pd.Series(values, dtype=float)
    if values.empty:
        return np.nan, np.nan
    std = float(values.std(ddof=1)) if len(values) > 1 else np.nan
    return float(values.mean(skipna=False)), std


class SelectionCost:
    """The whole costs of one backbone and task's choices, per fine-tuning seed, from its
    candidate head runs (HEAD_RUN_COLUMNS; other columns are ignored)."""

    def __init__(self, head_runs: pd.DataFrame):
        self.checkpoints = checkpoint_spend(head_runs[HEAD_RUN_COLUMNS] if len(head_runs) else head_runs)
        self.seeds = selection_spend(self.checkpoints)

    def over_checkpoints(self) -> tuple[float, float]:
        """A pick among every head on every checkpoint: mean and std over fine-tuning seeds."""
        return mean_std(self.seeds["whole_s"])

    def up_to(self, fraction: float) -> tuple[float, float]:
        """A pick among every head on the checkpoints of at most ``fraction`` epochs."""
        return mean_std(selection_spend(self.checkpoints, fraction)["whole_s"])

    def at_checkpoint(self, fraction: float) -> tuple[float, float]:
        """A pick among the heads of one checkpoint: mean and std over fine-tuning seeds."""
        at = self.checkpoints[self.checkpoints["epoch_fraction"] == fraction]
        return mean_std(at["whole_s"])
