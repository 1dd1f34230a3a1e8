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
from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import PEER
from bertvision.reporting.choice import ranks_before
from bertvision.reporting.summary import ROW_KINDS, rival_of

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


def unlearned_line(task, block: pd.DataFrame) -> str:
    """One sentence naming the rows whose dev score is no better than a constant prediction (within
    ``learning_bar``) while another row's is: a method that collapsed to one class (a peer, full
    fine-tuning, BERT at a checkpoint) otherwise reads as that method's fair score. Where no row
    learned, the verdict says so instead."""
    base = block["constant_score"].iloc[0]
    if np.isnan(base):
        return ""
    bar = learning_bar(task)
    low = block[block["dev_mean"] <= base + bar]
    if low.empty or len(low) == block["dev_mean"].notna().sum():
        return ""
    names = [
        f"{r.model} ({r.row}" + ("" if np.isnan(r.checkpoint) else f", {r.checkpoint:g} epochs") + f") {r.dev_mean:.3g}"
        for r in low.itertuples()
    ]
    return (
        f"No better than {CONSTANT_PREDICTION[task.kind]} (within {bar:g} {task.primary_metric} of it): "
        f"{', '.join(names)}; such a run learned nothing, whatever its method can do."
    )


def why_nothing_learned(task, block: pd.DataFrame, base: float) -> str | None:
    """Why no model learned the task, or None when one did: no candidate tried (``best_dev_any``:
    every head, ensemble and checkpoint, not only the rows shown) beats the constant prediction by
    more than ``learning_bar``; or neither the picked path nor the best method on the selection
    split beats it beyond dev's sampling noise (``score_low``: the low end of a 95% bootstrap of
    its score over dev's rows, where one was drawn), since the best of many candidates on dev
    clears a fixed bar by chance on a few hundred rows."""
    scores = (
        block["best_dev_any"] if "best_dev_any" in block and block["best_dev_any"].notna().any() else block["dev_mean"]
    )
    if np.isnan(base) or scores.isna().all():
        return None
    if (scores.dropna() <= base + learning_bar(task)).all():
        return (
            f"no model tried (every head, checkpoint and seed, not only the rows shown) beats "
            f"{CONSTANT_PREDICTION[task.kind]} by more than {learning_bar(task):g} {task.primary_metric} "
            f"({100 * LEARNING_MARGIN:g}% of the metric's range)"
        )
    lows = block["score_low"].dropna() if "score_low" in block else pd.Series(dtype=float)
    if len(lows) and (lows <= base).all():
        rows = block["dev_rows"].dropna()
        over = f"dev's {int(rows.iloc[0])} rows" if len(rows) else "dev's rows"
        return (
            f"neither the pick nor the best method on the selection split beats {CONSTANT_PREDICTION[task.kind]} "
            f"({base:.3g}) beyond dev's sampling noise (a 95% bootstrap over {over} of each one's score reaches "
            f"down to {lows.min():.3g})"
        )
    return None


def _deterministic(row: pd.Series) -> bool:
    """A method whose result does not depend on the seed (a peer with no training or a convex
    fit): its one run is exact, its spread zero by construction, not unmeasured."""
    return row.get("deterministic") is True or row.get("deterministic") == 1.0


def undetermined_reason(picked: pd.Series, reference: pd.Series, name: str = "full fine-tuning") -> str | None:
    """Why the seeds cannot measure the spread of the picked path or of the ``reference`` method
    (``name``; None when they can): a side with one seed; a side whose seeds all scored the same
    (a std of 0 measures no spread); a path on a fine-tuned checkpoint with one fine-tuning seed
    (its spread covers the head seeds only, not the fine-tuning's). A deterministic method has no
    spread to measure."""
    sides = [(n, row) for n, row in ((name, reference), ("the picked path", picked)) if not _deterministic(row)]
    single = [n for n, row in sides if row["n"] < 2]
    if single:
        return f"{' and '.join(single)} ran one seed, so its spread is unknown"
    flat = [n for n, row in sides if row["dev_std"] == 0]
    if flat:
        return f"{' and '.join(flat)} scored the same on every seed, so its spread is unmeasured"
    if picked.get("checkpoint", 0) > 0 and picked.get("ft_seeds", 2) < 2:
        return "the picked path's encoder was fine-tuned with one seed, so its spread covers the head seeds only"
    return None


def _std(row: pd.Series) -> float:
    return 0.0 if _deterministic(row) else row["dev_std"]


def dev_interval(picked: pd.Series, against: str) -> tuple[float, float, int] | None:
    """The picked row's paired bootstrap interval of its difference from full fine-tuning
    (``against="score_diff"``) or from the verdict's rival (``"rival_diff"``) and dev's rows, from
    the summary's columns; None where it was not computed."""
    low, high = picked.get(f"{against}_low"), picked.get(f"{against}_high")
    if low is None or high is None or np.isnan(low) or np.isnan(high):
        return None
    return float(low), float(high), int(picked["dev_rows"])


def standing(
    task, picked: pd.Series, reference: pd.Series, name: str = "full fine-tuning", interval=None
) -> tuple[str, float, str]:
    """Where the picked path stands against ``reference`` on dev: ("undetermined" | "noise" |
    "ahead" | "behind", the points between them, the words in brackets). Beyond the seeds' spread
    is still noise when ``interval`` (``dev_interval``: another draw of dev's rows) holds no
    difference."""
    points = (picked["dev_mean"] - reference["dev_mean"]) * 100.0 / task.metric_scale()
    reason = undetermined_reason(picked, reference, name)
    if reason:
        return "undetermined", points, f"{points:+.1f} points; {reason}"
    if abs(picked["dev_mean"] - reference["dev_mean"]) <= _std(picked) + _std(reference):
        return "noise", points, f"{points:+.1f} points; the two mean ± std ranges overlap"
    spread = _std(reference)
    std = f", {abs(picked['dev_mean'] - reference['dev_mean']) / spread:.1f} of its std" if spread > 0 else ""
    if interval is None:
        return ("ahead" if points >= 0 else "behind"), points, f"beyond the seeds' spread{std}"
    low, high, rows = (interval[0] * 100.0 / task.metric_scale(), interval[1] * 100.0 / task.metric_scale(),
                       interval[2])  # fmt: skip
    drawn = f"a 95% paired bootstrap over dev's {rows} rows gives {low:+.1f} to {high:+.1f} points"
    if low <= 0 <= high:
        return "noise", points, f"{points:+.1f} points, beyond the seeds' spread{std}, but {drawn}"
    return ("ahead" if points >= 0 else "behind"), points, f"beyond the seeds' spread{std}; {drawn}"


def comparison(task, picked: pd.Series, reference: pd.Series, name: str = "full fine-tuning") -> str:
    """The bold phrase: undetermined against, within noise of, beats or trails ``name``, with the points."""
    kind, points, detail = standing(task, picked, reference, name, dev_interval(picked, "score_diff"))
    if kind == "undetermined":
        return f"**undetermined against {name}** ({detail})"
    if kind == "noise":
        return f"**within noise of {name}** ({detail})"
    if kind == "ahead":
        return f"**beats {name} by {points:.1f} points** ({detail})"
    return f"**trails {name} by {-points:.1f} points** ({detail})"


def against_best(task, picked: pd.Series, what: str, rival: pd.Series, rival_name: str, pick_is_best: bool) -> str:
    """The verdict's first sentence: where the BERTVision pick (``what``) stands on dev against the
    best other method on the selection split (``rival``), and at what whole-cost ratio to it. A
    pick that trails it beyond the seeds' spread says so first, even when the pick itself scored
    best on selection."""
    ratio = picked["whole_seconds"] / rival["whole_seconds"] if rival["whole_seconds"] else np.nan
    cost = "" if np.isnan(ratio) else f", at {ratio:.2f}× its whole compute"
    kind, points, detail = standing(task, picked, rival, rival_name, dev_interval(picked, "rival_diff"))
    if kind == "behind":
        chosen = (
            "the pick scored best on the selection split"
            if pick_is_best
            else f"{rival_name} is also the best method on the selection split"
        )
        return (
            f"**{rival_name} beats the BERTVision pick**: {what} trails it by {-points:.1f} points on dev "
            f"({detail}){cost}; {chosen}."
        )
    if pick_is_best:
        return (
            f"**The BERTVision pick is the best method on the selection split**: {what}; against the best other "
            f"method, {rival_name}, it is {_standing_words(kind, points)} ({detail}){cost}."
        )
    return (
        f"**{rival_name} is the best method on the selection split**; the BERTVision pick, {what}, is "
        f"{_standing_words(kind, points)} ({detail}){cost}."
    )


def _standing_words(kind: str, points: float) -> str:
    return {
        "undetermined": "undetermined against it",
        "noise": "within noise of it",
        "ahead": f"ahead of it by {points:.1f} points on dev",
        "behind": f"behind it by {-points:.1f} points",
    }[kind]


def cost_phrase(picked: pd.Series) -> str:
    """The picked path's cost against full fine-tuning's, stated on the whole compute (everything
    run to make the pick against every epoch full fine-tuning trained), the own seconds beside it."""
    own, whole = picked["cost_ratio"], picked["whole_cost_ratio"]
    if np.isnan(whole):
        return f"{own:.2f}× full fine-tuning's own seconds (the whole compute is not in these records)"
    return f"{whole:.2f}× full fine-tuning's whole compute (own seconds {own:.2f}×)"


def nothing_learned(what: str, why: str) -> str:
    """The words for a task no model learned: the pick is named, no winner is."""
    return (
        f"The pipeline picks {what}, but **no model learned this task**: {why}, so there is no winner and the Δ "
        "column is noise."
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


def _method_name(row: pd.Series) -> str:
    return "full fine-tuning" if row["row"] == ROW_KINDS[0] else f"{row['model']} (peer)"


def verdict(block: pd.DataFrame) -> str:
    """Plain words for a block: whether any model learned the task and, if so, the best method on
    the selection split (full fine-tuning, a peer or the BERTVision pick) and where the pick
    stands against it, then against full fine-tuning where that is another method."""
    task = get_task(block["task"].iloc[0])
    picked = block[block["row"] == ROW_KINDS[2]]
    if picked.empty:
        return "No BERTVision path has a selection score yet."
    p = picked.iloc[0]
    what = f"`{p['model']}` on the {p['checkpoint']:g}-epoch checkpoint"
    if why := why_nothing_learned(task, block, block["constant_score"].iloc[0]):
        return nothing_learned(what, why)
    full = block[block["row"] == ROW_KINDS[0]]
    if not block["row"].isin([ROW_KINDS[0], PEER]).any():
        return (
            f"The pipeline picks {what}; no full fine-tuning baseline ran (baseline.enabled) and no peer "
            "(peers.methods), so there is no verdict."
        )
    rival = rival_of(block)
    if rival is None:
        lead = f"The pipeline picks {what}."
    else:
        pick_is_best = ranks_before(p, rival)
        lead = against_best(task, p, what, rival, _method_name(rival), pick_is_best)
    if full.empty:
        return f"{lead} No full fine-tuning baseline ran (baseline.enabled)."
    if rival is not None and rival["row"] == ROW_KINDS[0]:  # the lead has said where it stands against it
        cost = f"at {cost_phrase(p)}" if np.isnan(p["whole_cost_ratio"]) else f"(own seconds {p['cost_ratio']:.2f}×)"
        # a head's share is of the encoder that computed its states, which full fine-tuning trains
        # with its pooler and classifier besides (0.7% more for MiniLM)
        return f"{lead} The pick trains {p['parameter_percent']:.3g}% of the encoder's parameters {cost}."
    return (
        f"{lead} Against full fine-tuning: {comparison(task, p, full.iloc[0])}, at {cost_phrase(p)} "
        f"and {p['parameter_percent']:.3g}% of the encoder's parameters."
    )
