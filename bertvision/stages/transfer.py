"""Cross-checkpoint transfer: heads trained on the hidden states of one checkpoint, evaluated
unchanged on the states of every checkpoint of the same fine-tuning run: once with the
input standardization it was trained with ("source"), and once standardized with the target
checkpoint's own train-split statistics ("target"). The diagonal with "source" re-evaluates
each head on its own features and must reproduce its own metrics. The data-fraction heads (trained
on a share of a checkpoint's rows, ``train_fraction`` < 1) are applied the same way: the original's
heads trained on little data at one checkpoint and used on a later checkpoint's states."""

from __future__ import annotations

import logging
from pathlib import Path

from bertvision.config.settings import HeadRuntimeSettings
from bertvision.features.source import StreamSource
from bertvision.files import atomic_write_json, read_json
from bertvision.layout import HEAD_METRICS, head_runs
from bertvision.models.head_io import load_head
from bertvision.models.heads import Standardized, standardized
from bertvision.registry.task_spec import TaskSpec
from bertvision.reporting.results import raced_out
from bertvision.runtime.device import set_threads
from bertvision.training.problems import Problems

log = logging.getLogger(__name__)


def transfer(
    task: TaskSpec,
    head_dirs: list[Path],
    manifests: list[Path | StreamSource],
    raw_dir: Path,
    out: Path,
    runtime: HeadRuntimeSettings,
    in_memory_max_mb: float,
    threads: int | None = None,
) -> list[dict]:
    """Evaluate every head run under ``head_dirs`` (one train_heads output per checkpoint) on
    every checkpoint's features in ``manifests``; write the records to ``out``."""
    set_threads(threads)
    # a head the race stopped was cut short: its transfer would say little of the states (the tables leave it out)
    trained = {run: read_json(run / HEAD_METRICS) for run in sorted(r for d in head_dirs for r in head_runs(d))}
    runs = {run: record for run, record in trained.items() if not raced_out(record)}
    records = []
    for manifest in manifests:  # a manifest, or a stream source (store: false)
        problems = Problems(task, manifest, runtime, in_memory_max_mb, raw_dir)
        target = problems.feats["train"].manifest["source"]
        for run, record in runs.items():
            spec = record["head_spec"]
            problem = problems.get(spec)
            layers, hidden = problem.shape
            head = load_head(run, layers, hidden, task.num_labels).to(problems.device)
            variants = {"source": head}
            if isinstance(head, Standardized) and head.standardizes_input:
                # The same weights with the input standardized by the target checkpoint's own
                # train-split statistics (no labels involved): undoes the shift in scale.
                restandardized = standardized(head.head, problems.moments(spec), head.label_moments)
                variants["target"] = restandardized.to(problems.device).eval()
            for standardization, model in variants.items():
                metrics, _, _ = problem.evaluate(model, None)
                records.append(
                    {
                        "backbone": record["source"]["model"],
                        "task": task.name,
                        "head": record["head"],
                        "ft_seed": record["source"]["ft_seed"],
                        "seed": record["seed"],
                        "train_fraction": record["train_fraction"],
                        "trained_on": str(record["source"]["checkpoint"]),
                        "evaluated_on": str(target["checkpoint"]),
                        # checkpoint 0 is every fine-tuning run's: its heads on its states recur in each seed's file
                        "evaluated_ft_seed": target["ft_seed"],
                        "standardization": standardization,
                        "metrics": {s: m for s, m in metrics.items() if s in task.eval_splits},
                    }
                )
        log.info("evaluated %d heads on checkpoint %s", len(runs), target["checkpoint"])
    atomic_write_json({"task": task.name, "records": records}, out)
    return records
