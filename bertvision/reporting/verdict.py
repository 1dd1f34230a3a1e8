"""The summary's plain words for one task: whether any model learned it, and whether the picked
BERTVision path differs from full fine-tuning by more than the seeds' noise. A task where every
row scores within ``LEARNING_MARGIN`` of a constant prediction (``constant_score`` in the
records: the best single class, a constant regression output, or abstaining on every
question) gets no winner; a difference the seeds cannot measure (one seed on a side, a side
with no spread, one fine-tuning seed behind a fine-tuned path) is undetermined, and one inside
the seeds' spread is noise."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.registry.metrics import METRICS

# A model "learned something" when it beats the constant prediction by more than this share of
# the metric's scale (2 points of accuracy or F1); the degenerate-run flags use the same tolerance.
LEARNING_MARGIN = 0.02

# Task kind -> what the constant prediction is, in words.
CONSTANT_PREDICTION = {
    "classification": "predicting the same class every time",
    "regression": "a constant prediction",
    "span": "abstaining on every question",
}


def constant_line(task, base: float) -> str:
    """One sentence: what a constant prediction scores on this task's reported split."""
    if np.isnan(base):
        return ""
    value = f"{base:.2f}" if task.metric_scale() > 1 else f"{base:.3f}"
    return f"For reference, {CONSTANT_PREDICTION[task.kind]} scores {value} {task.primary_metric} here."


def learning_bar(task) -> float:
    """How far above the constant prediction a score must be to count as learned: ``LEARNING_MARGIN``
    of the primary metric's range (0..1 or 0..100; -1..1 for MCC and correlations, twice as wide)."""
    metric = METRICS[task.kind][task.primary_metric]
    return LEARNING_MARGIN * metric.scale * (2 if metric.zero_is_chance else 1)


def learned_nothing(task, block: pd.DataFrame, base: float) -> bool:
    """Whether no model tried beats the constant prediction by more than ``learning_bar``: every
    candidate of the task (``best_dev_any``: every head, ensemble and checkpoint, not only the
    rows shown), else the block's rows."""
    scores = (
        block["best_dev_any"] if "best_dev_any" in block and block["best_dev_any"].notna().any() else block["dev_mean"]
    )
    if np.isnan(base) or scores.isna().all():
        return False
    return bool((scores.dropna() <= base + learning_bar(task)).all())


def undetermined_reason(picked: pd.Series, reference: pd.Series) -> str | None:
    """Why the seeds cannot measure the spread of the picked path or of full fine-tuning (None
    when they can): a side with one seed; a side whose seeds all scored the same (a std of 0
    measures no spread); a path on a fine-tuned checkpoint with one fine-tuning seed (its spread
    covers the head seeds only, not the fine-tuning's)."""
    sides = (("full fine-tuning", reference), ("the picked path", picked))
    single = [name for name, row in sides if row["n"] < 2]
    if single:
        return f"{' and '.join(single)} ran one seed, so its spread is unknown"
    flat = [name for name, row in sides if row["dev_std"] == 0]
    if flat:
        return f"{' and '.join(flat)} scored the same on every seed, so its spread is unmeasured"
    if picked.get("epoch_fraction", 0) > 0 and picked.get("ft_seeds", 2) < 2:
        return "the picked path's encoder was fine-tuned with one seed, so its spread covers the head seeds only"
    return None


def comparison(task, picked: pd.Series, reference: pd.Series) -> str:
    """The bold phrase: undetermined against, within noise of, beats or trails full fine-tuning,
    with the points."""
    points = (picked["dev_mean"] - reference["dev_mean"]) * 100.0 / task.metric_scale()
    reason = undetermined_reason(picked, reference)
    if reason:
        return f"**undetermined against full fine-tuning** ({points:+.1f} points; {reason})"
    if abs(picked["dev_mean"] - reference["dev_mean"]) <= picked["dev_std"] + reference["dev_std"]:
        return f"**within noise of full fine-tuning** ({points:+.1f} points; the two mean ± std ranges overlap)"
    units = picked["score_diff_std_units"]
    std = "" if np.isnan(units) else f", {abs(units):.1f} of full fine-tuning's std"
    if points >= 0:
        return f"**beats full fine-tuning by {points:.1f} points** (beyond the seeds' spread{std})"
    return f"**trails full fine-tuning by {-points:.1f} points** (beyond the seeds' spread{std})"


def cost_phrase(picked: pd.Series) -> str:
    """The picked path's cost against full fine-tuning's, stated on the whole compute (everything
    run to make the pick against every epoch full fine-tuning trained), the own seconds beside it."""
    own, whole = picked["cost_ratio"], picked["whole_cost_ratio"]
    if np.isnan(whole):
        return f"{own:.2f}× full fine-tuning's own seconds (the whole compute is not in these records)"
    return f"{whole:.2f}× full fine-tuning's whole compute (own seconds {own:.2f}×)"


def nothing_learned(task, what: str) -> str:
    """The words for a task no model learned: the pick is named, no winner is."""
    return (
        f"The pipeline picks {what}, but **no model learned this task**: no model tried (every head, checkpoint "
        f"and seed, not only the rows shown) beats {CONSTANT_PREDICTION[task.kind]} by more than "
        f"{learning_bar(task):g} {task.primary_metric} ({100 * LEARNING_MARGIN:g}% of the metric's range), so there "
        "is no winner and the Δ column is noise."
    )


def no_window_line(block: pd.DataFrame) -> str:
    """Answerability: the answerable dev questions none of whose windows holds the whole answer."""
    missed = block["answerable_no_window"].iloc[0]
    if np.isnan(missed):
        return ""
    if missed == 0:
        return "Every answerable dev question has a window that holds its whole answer."
    return (
        f"{int(missed)} answerable dev questions have no window that holds the whole answer; they are scored "
        'as answerable (the data\'s label), though every window of theirs trains as "no answer".'
    )
