"""The summary table: per backbone and task, full fine-tuning, the peers, BERT at each partial
checkpoint, the BERTVision path the pipeline would pick and the best frozen-encoder head, with
what each cost (``reporting.summary_page`` renders it, ``reporting.verdict`` words it).

The picked path: checkpoint, head, and head alone or head + BERT ensemble, the highest mean
selection score over every candidate; the best frozen-encoder head (0 epochs) also by selection.
Every choice reads the selection split only; the dev scores are reported, never compared. Own
seconds: full fine-tuning's training time to its kept epoch; BERT's to its checkpoint; a head's
path adds the extraction of that checkpoint's features (the jobs' wall time) and the head's own
training. Whole seconds: the wall time of every job that had to run to make the row's choice
(``reporting.whole_cost``); the verdict is stated on them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import FULL_FT, PEER
from bertvision.reporting.choice import bertvision_paths, counted_once, over_seeds, passed_over, pick
from bertvision.reporting.picks import Pick
from bertvision.reporting.results import BERT
from bertvision.reporting.significance import paired_interval
from bertvision.reporting.whole_cost import SelectionCost

# Row kinds, in the order a block lists them.
ROW_KINDS = (
    FULL_FT,
    "BERT at a checkpoint",
    "BERTVision (picked)",
    "BERTVision within a budget",
    "frozen encoder (best head)",
    # listed right after full fine-tuning: what a practitioner would use instead (registry/peers)
    PEER,
)
SUMMARY_COLUMNS = [
    "backbone",
    "task",
    "row",
    "budget",  # a pick within a budget: the largest checkpoint it chose among
    "checkpoint",
    "model",
    "metric",
    "dev_mean",
    "dev_std",
    "n",
    "ft_seeds",
    "selection_mean",
    "trainable_params",
    "parameter_percent",
    "seconds",
    "seconds_std",
    # everything run to make the row's choice, mean and std over fine-tuning seeds
    "whole_seconds",
    "whole_seconds_std",
    "feature_bytes",
    "score_diff",
    "score_diff_std_units",
    # the picked row's 95% paired bootstrap intervals over dev's rows (``reporting.significance``) of
    # its difference from full fine-tuning and from the verdict's rival (``rival_of``)
    "dev_rows",
    "score_diff_low",
    "score_diff_high",
    "rival_diff_low",
    "rival_diff_high",
    # the low end of a 95% bootstrap interval of the score itself over dev's rows: of the picked row
    # and of the verdict's rival, the two the "learned anything" bar reads
    "score_low",
    "cost_ratio",
    "whole_cost_ratio",
    # what a constant prediction scores on dev (the bar for having learned anything), and for
    # answerability the answerable dev questions no window wholly holds
    "constant_score",
    "answerable_no_window",
    "device",
    "precision",
    "pair",  # the heads' rows: a pair task's texts encoded as one sequence (joint) or apart
    # a peer whose result does not depend on the seed: one run, its spread zero by construction
    "deterministic",
    "searched",  # a head whose parameters the optuna search chose (on the selection split)
    "best_dev_any",
    "head_selection",
    "head_runs",
    "raced_out_runs",
    # the path with the best mean selection score where the pick is an earlier checkpoint's within
    # its noise (``reporting.choice.passed_over``): its name, checkpoint, score and the difference's error
    "passed_over",
    "passed_over_checkpoint",
    "passed_over_selection",
    "passed_over_error",
]


def _whole_seconds(label: str, config: pd.Series, cost: SelectionCost) -> tuple[float, float]:
    """Mean and std over fine-tuning seeds of everything run to make a row's choice: the picked
    path's, among every checkpoint; the frozen encoder's best head's, among its checkpoint's
    heads; full fine-tuning's and BERT's, their own runs (``reporting.whole_cost``)."""
    if label == ROW_KINDS[2]:
        return cost.over_checkpoints()
    if label == ROW_KINDS[3]:
        return cost.up_to(config["budget"])
    if label == ROW_KINDS[4]:
        return cost.at_checkpoint(config["checkpoint"])
    return config["whole_seconds"], config["whole_seconds_std"]


def summary_table(runs: pd.DataFrame, picks: list[Pick]) -> pd.DataFrame:
    """One block of rows (ROW_KINDS) per backbone and task, with the ratios against full
    fine-tuning where the baseline ran; the picked row is ``picks``' (``reporting.choice.choose_picks``)."""
    out = []
    if runs.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    picked_paths = {(p.backbone, p.task): p for p in picks}
    for (backbone, task_name), block in runs.groupby(["backbone", "task"], sort=True):
        task = get_task(task_name)
        configs = over_seeds(counted_once(block))
        chosen = []
        full = configs[configs["kind"] == FULL_FT]
        chosen += [(ROW_KINDS[0], r) for _, r in full.iterrows()]
        chosen += [(PEER, r) for _, r in configs[configs["kind"] == PEER].iterrows()]
        partial = configs[(configs["kind"] == BERT) & (configs["checkpoint"] > 0)].sort_values("checkpoint")
        chosen += [(ROW_KINDS[1], r) for _, r in partial.iterrows()]
        paths = bertvision_paths(configs)
        picked = picked_paths.get((backbone, task_name))
        if picked is not None:
            path = paths[(paths["checkpoint"] == picked.checkpoint.fraction) & (paths["model"] == picked.model)]
            chosen.append((ROW_KINDS[2], path.iloc[0]))
        # the same pick among the checkpoints of at most c epochs, for each c between 0 and the largest
        for budget in sorted(set(paths["checkpoint"]))[1:-1]:
            within = pick(paths[paths["checkpoint"] <= budget])
            if within is not None:
                chosen.append((ROW_KINDS[3], pd.concat([within, pd.Series({"budget": budget})])))
        frozen = pick(configs[(configs["kind"] == "head") & (configs["checkpoint"] == 0)])
        if frozen is not None:
            chosen.append((ROW_KINDS[4], frozen))
        ref = full.iloc[0] if len(full) else None
        cost = SelectionCost(block[block["kind"] == "head"])
        # the same for every run on the task's dev split (NaN: records from before they were kept)
        facts = {k: block[k].max() if k in block else np.nan for k in ("constant_score", "answerable_no_window")}
        facts["best_dev_any"] = configs["dev_mean"].max()  # every candidate tried: "no model learned" reads it
        over = passed_over(paths)
        facts |= {
            "passed_over": over[0]["model"] if over else None,
            "passed_over_checkpoint": over[0]["checkpoint"] if over else np.nan,
            "passed_over_selection": over[0]["selection_mean"] if over else np.nan,
            "passed_over_error": over[1] if over else np.nan,
        }
        head_rows = counted_once(block)[lambda b: b["kind"] == "head"]
        protocols = set(head_rows.get("head_selection", pd.Series(dtype=object)).dropna())
        facts |= {
            "head_selection": "racing" if "racing" in protocols else "grid",
            "head_runs": len(head_rows),
            "raced_out_runs": int(head_rows["raced_out"].isin([True]).sum()) if "raced_out" in head_rows else 0,
        }
        rows, predictions = [], []
        for label, r in chosen:
            whole, whole_std = _whole_seconds(label, r, cost)
            predictions.append(r.get("predictions"))
            diff = r["dev_mean"] - ref["dev_mean"] if ref is not None else np.nan
            ref_std = ref["dev_std"] if ref is not None else np.nan
            rows.append(
                {
                    "backbone": backbone,
                    "task": task_name,
                    "row": label,
                    "budget": r.get("budget", np.nan),
                    "checkpoint": r["checkpoint"],
                    "model": r["model"],
                    "metric": task.primary_metric,
                    "dev_mean": r["dev_mean"],
                    "dev_std": r["dev_std"],
                    "n": int(r["n"]),
                    "ft_seeds": int(r["ft_seeds"]),
                    "selection_mean": r["selection_mean"],
                    "trainable_params": int(r["trainable_params"]),
                    "parameter_percent": 100.0 * r["trainable_params"] / r["encoder_params"],
                    "seconds": r["seconds"],
                    "seconds_std": r["seconds_std"],
                    "whole_seconds": whole,
                    "whole_seconds_std": whole_std,
                    "feature_bytes": r["feature_bytes"],
                    "score_diff": diff,
                    "score_diff_std_units": diff / ref_std if ref_std and ref_std > 0 else np.nan,
                    "cost_ratio": r["seconds"] / ref["seconds"] if ref is not None else np.nan,
                    "whole_cost_ratio": whole / ref["whole_seconds"] if ref is not None else np.nan,
                    **facts,
                    "device": r["device"],
                    "precision": r["precision"],
                    "pair": r.get("pair"),
                    "deterministic": bool(r.get("deterministic") is True),
                    "searched": bool(r.get("searched", False) == True),  # noqa: E712 (NaN: a row of no head)
                }
            )
        out += with_intervals(task, pd.DataFrame(rows, columns=SUMMARY_COLUMNS), predictions)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def rival_of(block: pd.DataFrame) -> pd.Series | None:
    """The verdict's rival: the best method on the selection split among full fine-tuning and the
    peers, by the pick's own ranking (selection score, then fewer parameters)."""
    return pick(block[block["row"].isin([ROW_KINDS[0], PEER])])


def with_intervals(task, block: pd.DataFrame, predictions: list) -> list[dict]:
    """The block's rows with the picked row's paired bootstrap intervals (``reporting.significance``),
    the ones the verdict reads: its difference from full fine-tuning and from the rival (often the
    same run: drawn once). NaN where a side kept no predictions, and on the other rows: each interval
    scores every seed of both sides a thousand times, which at QQP's 40k dev rows is not free."""
    picked = block.index[block["row"] == ROW_KINDS[2]]
    if len(picked) == 0:
        return block.to_dict("records")
    full = block.index[block["row"] == ROW_KINDS[0]]
    rival = rival_of(block)
    drawn = {}
    for column, other in (("score_diff", full[0] if len(full) else None), ("rival_diff", getattr(rival, "name", None))):
        if other is None:
            continue
        if other not in drawn:
            drawn[other] = paired_interval(task, predictions[picked[0]], predictions[other])
        if drawn[other] is not None:
            block.loc[picked[0], [f"{column}_low", f"{column}_high", "dev_rows"]] = drawn[other]
    for row in (picked[0], getattr(rival, "name", None)):
        if row is not None and (alone := paired_interval(task, predictions[row], None)) is not None:
            block.loc[row, "score_low"] = alone[0]
    return block.to_dict("records")
