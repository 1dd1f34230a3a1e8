"""The race between checkpoints (``heads.race``, protocol racing): after the heads of a checkpoint
have trained (every fine-tuning seed), decide whether fine-tuning goes on to the next one.

The best candidate at a checkpoint is the one the pick would take there (``reporting.ranking``): the
head, or head + BERT ensemble, with the highest mean selection score over its runs, among those
that every job ran to the end.
Fine-tuning goes on from the first checkpoint (the untouched encoder) to the second always (only
a fine-tuned one can show whether fine-tuning helps). Past a later checkpoint, under
``checkpoint_rule: spread`` (the default), it goes on unless the best candidate's gain over every
earlier checkpoint's best stays at or below ``min_gain`` (a share of the metric's best possible
score) by more than the gain's standard error over the runs: a gain the seeds cannot tell from
the bar is no reason to stop. ``checkpoint_rule: gain`` compares the gain with ``min_gain`` alone
(which stopped MRPC and STS-B at 0.3 epochs on gains of 0.0041 and 0.0049, 4 points short of
1 epoch's). Dev is never read."""

from __future__ import annotations

import logging
import math
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
    the race stopped in any of them is none): {candidate, selection, runs, standard_error (of its
    mean selection score, 0 with one run: unmeasured)}; None when none ranks."""
    top = best(head_candidates(task, [read_json(path) for path in head_metrics_files(head_dirs)]))
    if top is None:
        return None
    return {"candidate": top.name, "selection": top.selection, "runs": top.runs, "standard_error": top.standard_error}


def _gain_goes_on(gain: float, error: float, bar: float, rule: str) -> tuple[bool, str]:
    if rule == "gain":
        go_on = gain > bar
        return go_on, f"{gain:+.4f} {'>' if go_on else '<='} {bar:g}"
    go_on = gain + error > bar
    within = "above" if gain > bar else ("within noise of" if go_on else "below")
    return go_on, f"{gain:+.4f} ± {error:.4f} (standard error), {within} {bar:g}"


def decide_checkpoint(
    task: TaskSpec,
    model_name: str,
    checkpoint: Checkpoint,
    head_dirs: list[Path],
    race: RaceSettings,
    out: Path,
    previous_decision: Path | None = None,
    last: bool = False,
) -> dict:
    """Write (and return) the race's decision at ``checkpoint``: the best candidate there, the best of
    the earlier checkpoints (``previous_decision``: the decision before this one) and whether fine-tuning
    goes on to the next checkpoint."""
    before = read_json(previous_decision) if previous_decision else None
    best = best_candidate(task, head_dirs)
    here = best["selection"] if best else None
    best_before = before["best_so_far"] if before else None
    error_before = (before.get("best_so_far_error") or 0.0) if before else 0.0
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
        error = math.hypot(best["standard_error"], error_before)
        go_on, reading = _gain_goes_on(here - best_before, error, bar, race.checkpoint_rule)
        why = f"best selection {here:.4f} vs {best_before:.4f} before: {reading}"
    scored = [(here, best["standard_error"])] if best else []
    if best_before is not None:
        scored.append((best_before, error_before))
    so_far, so_far_error = max(scored, key=lambda pair: pair[0]) if scored else (None, None)  # None: none scored yet
    record = {
        "task": task.name,
        "model": model_name,
        "checkpoint": checkpoint.name,
        "best": best,
        "best_before": best_before,
        "best_so_far": so_far,
        "best_so_far_error": so_far_error,
        "min_gain": race.min_gain,
        "checkpoint_rule": race.checkpoint_rule,
        "last": last,
        "go_on": go_on,
        "why": why,
    }
    atomic_write_json(record, out)
    log.info("checkpoint %s: %s -> %s", checkpoint, why, "go on" if go_on else "stop")
    return record
