"""Each job's request beside what it used: the memory and runtime Snakemake asks a cluster for
(as its dry run prints them, attempt 1) against the job's measured peak memory (the usage line
its log ends with, ``runtime.usage``; else its benchmark file's sampled ``max_rss``) and wall
seconds. A request must cover the peak, and should not be far above it (``WASTE_LIMIT``,
above ``WASTE_FLOOR_MIB``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.reporting.markdown import markdown_table
from bertvision.reporting.timing import job_usage

WASTE_LIMIT = 3.0  # request / measured peak above this: asking for memory the job never touches
# Requests up to this are never called wasteful: a job's floor differs by 3x between a fresh
# interpreter and a child of the warm pool, and a cluster's default memory per CPU is often more.
WASTE_FLOOR_MIB = 2048
_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")


@dataclass(frozen=True)
class PlannedJob:
    rule: str
    wildcards: str
    log: str | None
    benchmark: str | None
    mem_mib: int | None
    runtime_min: int | None
    gpus: int = 0


def planned_jobs(dry_run: str) -> list[PlannedJob]:
    """Every job block of a Snakemake dry run's output (``-n --forceall`` lists them all)."""
    jobs, block = [], None

    def close() -> None:
        if block is not None and block["rule"] != "all":
            resources = dict(
                part.strip().split("=", 1) for part in block.get("resources", "").split(",") if "=" in part
            )
            jobs.append(
                PlannedJob(
                    rule=block["rule"],
                    wildcards=block.get("wildcards", ""),
                    log=block.get("log"),
                    benchmark=block.get("benchmark"),
                    mem_mib=int(resources["mem_mib"]) if "mem_mib" in resources else None,
                    runtime_min=int(resources["runtime"]) if "runtime" in resources else None,
                    gpus=int(resources.get("gpu", 0)),
                )
            )

    for line in dry_run.splitlines():
        rule = _RULE.match(line)
        if rule:
            close()
            block = {"rule": rule.group(1)}
            continue
        field = _FIELD.match(line)
        if block is not None and field:
            block.setdefault(field.group(1), field.group(2).strip())
        elif block is not None and not line.strip():
            close()
            block = None
    close()
    return jobs


def measured(job: PlannedJob, workdir: Path) -> dict:
    """Wall seconds and peak MiB of a finished job (``timing.job_usage``); Nones when it has no
    benchmark file (not run)."""
    if not job.benchmark or not (workdir / job.benchmark).exists():
        return {"seconds": None, "peak_mib": None, "peak_from": None}
    found = job_usage(workdir / job.benchmark, workdir / job.log if job.log else None)
    return {"seconds": found["seconds"], "peak_mib": found["max_rss_mb"], "peak_from": found["peak_from"]}


def requests_table(jobs: list[PlannedJob], workdir: Path) -> pd.DataFrame:
    """One row per job with a memory request: request, measured, their ratio and the verdict."""
    rows = []
    for job in jobs:
        if job.mem_mib is None:
            continue
        m = measured(job, workdir)
        peak = m["peak_mib"]
        unmeasured = peak is None or math.isnan(peak) or peak <= 0  # a job ended before its first sample
        ratio = None if unmeasured else job.mem_mib / peak
        if m["seconds"] is None:
            verdict = "not run"
        elif unmeasured:
            verdict = "peak not measured"
        elif peak > job.mem_mib:
            verdict = "OVER"
        elif job.runtime_min and m["seconds"] and m["seconds"] > 60 * job.runtime_min:
            verdict = "over runtime"
        elif ratio > WASTE_LIMIT and job.mem_mib > WASTE_FLOOR_MIB:
            verdict = "wasteful"
        else:
            verdict = "ok"
        rows.append(
            {
                "rule": job.rule,
                "job": job.wildcards,
                "request_mib": job.mem_mib,
                "peak_mib": m["peak_mib"],
                "request/peak": ratio,
                "runtime_min": job.runtime_min,
                "gpus": job.gpus,
                "seconds": m["seconds"],
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)


def per_rule(table: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, request and peak ranges, the largest and smallest ratio, GPUs asked for
    and verdicts."""

    def span(s) -> str:
        return f"{s.min()}–{s.max()}" if s.min() != s.max() else f"{s.min()}"

    return (
        table.groupby("rule", sort=True)
        .agg(
            jobs=("rule", "size"),
            request_mib=("request_mib", span),
            peak_mib=("peak_mib", lambda s: f"{s.min():.0f}–{s.max():.0f}" if s.notna().any() else "not run"),
            min_ratio=("request/peak", "min"),
            max_ratio=("request/peak", "max"),
            longest_s=("seconds", "max"),
            runtime_min=("runtime_min", "max"),
            gpus=("gpus", span),
            verdicts=("verdict", lambda s: ", ".join(f"{v} {n}" for v, n in s.value_counts().items())),
        )
        .reset_index()
    )


def _cells(df: pd.DataFrame) -> list[list[str]]:
    def cell(v) -> str:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ""
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    return [[cell(v) for v in row] for row in df.itertuples(index=False)]


def report(table: pd.DataFrame) -> str:
    """Markdown: the per-rule summary, then every job."""
    rules = per_rule(table)
    return (
        "## Per rule\n\n"
        + markdown_table(list(rules.columns), _cells(rules))
        + "\n\n## Per job\n\n"
        + markdown_table(list(table.columns), _cells(table))
        + "\n"
    )
