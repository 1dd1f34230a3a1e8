"""The race between checkpoints (``heads.race``, protocol racing): after the heads of a checkpoint
have trained (every fine-tuning seed), decide whether fine-tuning goes on to the next one.

The best candidate at a checkpoint is the one the pick would take there (``reporting.ranking``): the
head, or head + BERT ensemble, with the highest mean selection score over its runs, among those
that every job ran to the end.
Fine-tuning goes on from the first checkpoint (the untouched encoder) to the second always (only
a fine-tuned one can show whether fine-tuning helps), and past a later checkpoint only if its
best beat every earlier checkpoint's best by more than ``min_gain`` times the metric's best
possible score. Dev is never read."""

from __future__ import annotations

import logging
from pathlib import Path

from bertvision.config.settings import RaceSettings
from bertvision.files import atomic_write_json, read_json
from bertvision.layout import Checkpoint, head_metrics_files
from bertvision.registry.task_spec import TaskSpec
from bertvision.reporting.ranking import best, head_candidates

log = logging.getLogger(__name__)


def best_candidate(task: TaskSpec, head_dirs: list[Path]) -> dict | None:
    """The candidate (a head, or head + BERT ensemble) the pick would take among its runs in
    ``head_dirs`` (every fine-tuning seed's job at one checkpoint; ``reporting.ranking``: a head
    the race stopped in any of them is none): {candidate, selection, runs}; None when none ranks."""
    top = best(head_candidates(task, [read_json(path) for path in head_metrics_files(head_dirs)]))
    return None if top is None else {"candidate": top.name, "selection": top.selection, "runs": top.runs}


def decide_checkpoint(
    task: TaskSpec,
    model_name: str,
    checkpoint: Checkpoint,
    head_dirs: list[Path],
    race: RaceSettings,
    out: Path,
    previous: Path | None = None,
    last: bool = False,
) -> dict:
    """Write (and return) the race's decision at ``checkpoint``: the best candidate there, the best of
    the earlier checkpoints (``previous``: the decision before this one) and whether fine-tuning
    goes on to the next checkpoint."""
    before = read_json(previous) if previous else None
    best = best_candidate(task, head_dirs)
    here = best["selection"] if best else None
    best_before = before["best_so_far"] if before else None
    bar = race.min_gain * task.metric_scale()
    if last:
        go_on, why = False, "the last configured checkpoint"
    elif before is None:
        go_on, why = True, "the first checkpoint: the next one always runs"
    elif here is None:
        go_on, why = False, "no head has a selection score here"
    elif best_before is None:
        go_on, why = True, f"best selection {here:.4f}, none before"
    else:
        go_on = here > best_before + bar
        gain = here - best_before
        why = f"best selection {here:.4f} vs {best_before:.4f} before: {gain:+.4f} {'>' if go_on else '<='} {bar:g}"
    scored = [s for s in (here, best_before) if s is not None]
    record = {
        "task": task.name,
        "model": model_name,
        "checkpoint": checkpoint.name,
        "best": best,
        "best_before": best_before,
        "best_so_far": max(scored) if scored else None,  # None: no head scored yet
        "min_gain": race.min_gain,
        "last": last,
        "go_on": go_on,
        "why": why,
    }
    atomic_write_json(record, out)
    log.info("checkpoint %s: %s -> %s", checkpoint, why, "go on" if go_on else "stop")
    return record
