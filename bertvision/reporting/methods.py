"""Every method a run trained, on one cost-score plane per task: full fine-tuning, each peer
(``registry/peers``), BERT at each checkpoint and every BERTVision candidate (each head and head
+ BERT ensemble at each checkpoint), with its dev score (mean ± std over seeds), its selection
score, its trainable parameters and its cost in seconds. The cost of a method that chooses for
itself (full fine-tuning, a peer) is its jobs' wall time; of one BERTVision candidate, the jobs it
needs alone: fine-tuning to its checkpoint (with BERT's scoring), the checkpoint's extraction, its
own training seconds and its search. The cost-score front marks the methods no other beats on
both at once."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import FULL_FT, PEER, SEED_AGGREGATES, sample_std
from bertvision.reporting.markdown import fmt, markdown_table, seconds_cell
from bertvision.reporting.results import BERT

METHOD_COLUMNS = [
    "backbone", "task", "family", "model", "checkpoint", "metric", "dev_mean", "dev_std", "n",
    "selection_mean", "trainable_params", "parameter_percent", "cost_seconds", "cost_seconds_std", "stopped",
    "on_front",
]  # fmt: skip


def _family(kind: str) -> str:
    return {FULL_FT: "full fine-tuning", PEER: "peer", BERT: "BERT at a checkpoint"}.get(kind, "BERTVision")


def _cost(runs: pd.DataFrame) -> pd.Series:
    """Per run: its whole seconds (full fine-tuning, a peer, BERT), or a candidate's own jobs; unknown
    (NaN: a job's time not found) where one of them is, never counted as 0 s."""
    alone = sum(runs[c] if c in runs else 0.0 for c in ("finetune_jobs_s", "extract_jobs_s", "search_s"))
    own = runs["head_s"] if "head_s" in runs else np.nan
    return runs["whole_seconds"].where(runs["kind"].isin([FULL_FT, PEER, BERT]), alone + own)


def on_front(cost: pd.Series, score: pd.Series) -> pd.Series:
    """Whether each point is on the cost-score front: no other point costs at most as much and
    scores at least as much, with one of the two strictly."""
    flags = []
    for c, s in zip(cost, score):
        beaten = ((cost <= c) & (score >= s) & ((cost < c) | (score > s))).any()
        flags.append(bool(not beaten and not np.isnan(c) and not np.isnan(s)))
    return pd.Series(flags, index=cost.index)


def method_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per method and configuration, averaged over its seeds (``runs``: the candidates,
    ``reporting.candidates``); the untouched encoder's head runs repeated per fine-tuning seed
    counted once."""
    if runs.empty:
        return pd.DataFrame(columns=METHOD_COLUMNS)
    runs = runs[runs["repeat"] != True] if "repeat" in runs else runs  # noqa: E712
    stopped = runs["raced_out"].eq(True) if "raced_out" in runs else False
    runs = runs.assign(cost=_cost(runs), stopped=stopped)
    out = []
    for (backbone, task_name), block in runs.groupby(["backbone", "task"], sort=True):
        task = get_task(task_name)
        g = block.groupby(["kind", "checkpoint", "model"], sort=False, dropna=False)
        table = g.agg(
            **SEED_AGGREGATES,
            cost_seconds=("cost", lambda v: v.mean(skipna=False)),
            cost_seconds_std=("cost", sample_std),
            stopped=("stopped", "sum"),
        ).reset_index()
        # a run the race stopped early has a cut-short score and cost: shown, never on the front
        finished = table["stopped"] == 0
        table = table.assign(
            backbone=backbone,
            task=task_name,
            family=table["kind"].map(_family),
            metric=task.primary_metric,
            parameter_percent=100.0 * table["trainable_params"] / table["encoder_params"],
            on_front=on_front(table["cost_seconds"].where(finished), table["dev_mean"].where(finished)),
        )
        out.append(table.sort_values(["cost_seconds"], kind="stable"))
    return pd.concat(out, ignore_index=True)[METHOD_COLUMNS]


def methods_markdown(table: pd.DataFrame) -> str:
    parts = [
        "# Every method on cost and score",
        "",
        "Per task, every method the run trained, cheapest first: full fine-tuning, the peers (what a practitioner "
        "would use instead), BERT at each checkpoint and every BERTVision candidate (head or head + BERT at a "
        "checkpoint). Dev: mean ± std over seeds (reported, never chosen on). Seconds: a method that chooses its own "
        "settings (full fine-tuning, a peer) costs its jobs' wall time; one BERTVision candidate costs the jobs it "
        "needs alone (fine-tuning to its checkpoint, the extraction, its own training and search), less than a "
        "pick among all of them (the summary's whole cost). Front: no other method costs at most as much and "
        "scores at least as much on dev (a description of what ran, not a choice); a configuration the race "
        "stopped early in any of its runs (heads.race) is marked so and left off the front: its score and "
        "seconds are cut short.",
        "",
    ]
    for (backbone, task_name), block in table.groupby(["backbone", "task"], sort=False):
        task = get_task(task_name)
        scale = task.metric_scale()
        parts += [f"## {task_name} ({backbone}; {task.primary_metric}, {task.eval_splits[0]})", ""]
        rows = [
            [
                r.family,
                (r.model if np.isnan(r.checkpoint) else f"{r.model} @ {r.checkpoint:g}")
                + (f" (stopped by the race: {int(r.stopped)} of {int(r.n)})" if r.stopped else ""),
                fmt(r.dev_mean, r.dev_std, scale),
                str(int(r.n)),
                f"{r.selection_mean:.3f}" if scale == 1 else f"{r.selection_mean:.1f}",
                f"{r.parameter_percent:.3g}",
                seconds_cell(r.cost_seconds, r.cost_seconds_std),
                "yes" if r.on_front else "",
            ]
            for r in block.itertuples()
        ]
        headers = ["family", "method", f"dev {task.primary_metric}", "n", "selection", "% params", "seconds", "front"]
        parts += [markdown_table(headers, rows), ""]
    return "\n".join(parts)
