"""Wall time per stage and task, from Snakemake's benchmark files of the main pipeline's jobs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.layout import Job
from bertvision.reporting.markdown import markdown_table

STAGE_ORDER = ["download", "tokenize", "finetune", "baseline", "extract", "feature_manifest", "train_heads"]


def read_benchmark(job: Job) -> dict:
    """Wall seconds and peak memory of one job, from its benchmark file."""
    bench = pd.read_csv(job.benchmark, sep="\t")
    return {
        "seconds": float(bench["s"].iloc[0]),
        "max_rss_mb": float(pd.to_numeric(bench["max_rss"], errors="coerce").iloc[0]),
    }


def timing_table(jobs: list[Job]) -> pd.DataFrame:
    """Jobs, wall seconds (summed) and peak memory per (task, stage)."""
    rows = [{"stage": job.rule, "task": job.keys["task"], **read_benchmark(job)} for job in jobs]
    df = pd.DataFrame(rows, columns=["stage", "task", "seconds", "max_rss_mb"])
    return (
        df.groupby(["task", "stage"], sort=True)
        .agg(jobs=("seconds", "size"), seconds=("seconds", "sum"), max_rss_mb=("max_rss_mb", "max"))
        .reset_index()
    )


def timing_markdown(timing: pd.DataFrame) -> str:
    stages = [s for s in STAGE_ORDER if s in set(timing["stage"])] + sorted(set(timing["stage"]) - set(STAGE_ORDER))
    pivot = timing.pivot_table(index="task", columns="stage", values="seconds", aggfunc="sum").reindex(columns=stages)
    rows = [
        [task, *[("" if np.isnan(v) else f"{v:.1f}") for v in r], f"{np.nansum(r):.1f}"]
        for task, r in zip(pivot.index, pivot.to_numpy())
    ]
    total = pivot.sum(axis=0)
    rows.append(["**all**", *[f"{v:.1f}" for v in total], f"{total.sum():.1f}"])
    return "\n".join(
        [
            "# Wall time per stage (seconds, summed over jobs)",
            "",
            "From Snakemake `benchmark:` files; jobs ran in parallel, so the sum exceeds the elapsed time.",
            "",
            markdown_table(["task", *stages, "total"], rows),
            "",
        ]
    )
