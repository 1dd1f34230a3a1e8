"""Wall time per stage and task, from Snakemake's benchmark files of the main pipeline's jobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.jobs import Job
from bertvision.reporting.markdown import markdown_table
from bertvision.runtime.precision import computed_in
from bertvision.runtime.usage import read_usage

STAGE_ORDER = [
    "download",
    "tokenize",
    "finetune",
    "baseline",
    "extract",
    "feature_manifest",
    "score_bert",
    "train_heads",
]


def job_usage(benchmark: str | Path, log: str | Path | None) -> dict:
    """Wall seconds of one job from its benchmark file; its peak memory (MiB) from the usage line
    its log ends with (exact, and right for jobs forked from the warm pool), else the benchmark
    file's sampled ``max_rss``; ``peak_from`` says which."""
    bench = pd.read_csv(benchmark, sep="\t")
    usage = read_usage(log) if log else None
    if usage is not None:
        return {"seconds": float(bench["s"].iloc[0]), "max_rss_mb": usage.peak_mib, "peak_from": "log"}
    sampled = float(pd.to_numeric(bench["max_rss"], errors="coerce").iloc[0])
    return {"seconds": float(bench["s"].iloc[0]), "max_rss_mb": sampled, "peak_from": "benchmark"}


def read_benchmark(job: Job) -> dict:
    """Wall seconds and peak memory of one job of the main pipeline (``job_usage``)."""
    found = job_usage(job.benchmark, job.log)
    return {"seconds": found["seconds"], "max_rss_mb": found["max_rss_mb"]}


def stage_precisions(
    bert_records, baseline_records, head_records, manifests, peer_records=()
) -> dict[tuple[str, str], str]:
    """(task, stage) -> the precision the encoder computed in there, with its device ("bf16 on
    cpu"): fine-tuning and full fine-tuning from their records, extraction from the feature
    manifests, a streamed task's head jobs (which run the encoder) from their records, and the
    peers from theirs (a peer that read the task's embeddings: the embed job's). Records
    written before precisions were recorded say "unknown"."""
    found: dict[tuple[str, str], set] = {}

    def add(task: str, stage: str, precision, device) -> None:
        found.setdefault((task, stage), set()).add(f"{precision or 'unknown'} on {device or 'unknown'}")

    for r in bert_records:
        add(r["task"], "finetune", r.get("precision"), r.get("device"))
    for r in baseline_records:
        add(r["task"], "baseline", r.get("precision"), r.get("device"))
    for m in manifests:
        add(m["source"]["task"], "extract", computed_in(m.get("precision"), m.get("backend")), m.get("device"))
    for r in head_records:
        if not r.get("features_stored", True):
            precision = computed_in(r.get("states_precision"), r.get("states_backend"))
            add(r["task"], "train_heads", precision, r.get("device"))
    for r in peer_records:
        add(r["task"], "embed" if r.get("shared_encoding") else "peer", r.get("precision"), r.get("device"))
    return {key: ", ".join(sorted(values)) for key, values in found.items()}


def timing_table(jobs: list[Job], precisions: dict[tuple[str, str], str] | None = None) -> pd.DataFrame:
    """Jobs, wall seconds (summed), peak memory and the encoder's precision per (task, stage)."""
    precisions = precisions or {}
    rows = [
        {
            "stage": job.rule,
            "task": job.keys["task"],
            **read_benchmark(job),
            "precision": precisions.get((job.keys["task"], job.rule), ""),
        }
        for job in jobs
    ]
    df = pd.DataFrame(rows, columns=["stage", "task", "seconds", "max_rss_mb", "precision"])
    return (
        df.groupby(["task", "stage"], sort=True)
        .agg(
            jobs=("seconds", "size"),
            seconds=("seconds", "sum"),
            max_rss_mb=("max_rss_mb", "max"),
            precision=("precision", "first"),
        )
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
    used = timing[timing["precision"].fillna("") != ""]
    precision = [
        f"- {stage}: {', '.join(sorted(set(block['precision'])))}"
        for stage in stages
        if len(block := used[used["stage"] == stage])
    ]
    return "\n".join(
        [
            "# Wall time per stage (seconds, summed over jobs)",
            "",
            "From Snakemake `benchmark:` files of the main pipeline's jobs (download to train_heads, BERT's "
            "scoring, full fine-tuning, the embedding and the peers); the searches, the race's decisions, the "
            "experiments (data fraction, transfer, curves), the tables, plots and bundles are not in it (the "
            "summary's whole seconds count the searches and the race's decisions). Jobs ran in parallel, so the sum "
            "exceeds the elapsed time.",
            "",
            markdown_table(["task", *stages, "total"], rows),
            "",
            "The precision the encoder computed in (heads themselves train in fp32):",
            "",
            *precision,
            "",
        ]
    )
