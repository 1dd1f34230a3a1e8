"""The ``head_transfer`` stage: a source task's heads, trained on its own fine-tuned encoder's
states, applied as they are to a target task whose labels mean the same (RTE -> WNLI, MRPC ->
QQP): the target's states of that same encoder go in, its labels come out, matched by meaning
(``TaskSpec.label_order_from``). No target row trains or chooses anything; the target's
selection and evaluation splits are only scored."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from bertvision.config.settings import HeadRuntimeSettings
from bertvision.files import atomic_write_json, read_json
from bertvision.layout import HEAD_METRICS, head_runs
from bertvision.models.head_io import load_head
from bertvision.registry.task_spec import TaskSpec
from bertvision.reporting.results import raced_out
from bertvision.runtime.device import set_threads
from bertvision.training.problems import Problems

log = logging.getLogger(__name__)


class RelabeledHead(nn.Module):
    """``head`` (trained on ``source``) answering in ``target``'s label order: each output of a
    target label id is the head's output for the source label that means the same."""

    def __init__(self, head: nn.Module, *, source: TaskSpec, target: TaskSpec):
        super().__init__()
        self.head = head
        self.register_buffer("order", torch.as_tensor(target.label_order_from(source), dtype=torch.long))

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        return self.head(x, *args).index_select(-1, self.order)


def apply_heads_across_tasks(
    source: TaskSpec,
    target: TaskSpec,
    head_dir: Path,
    head_names: list[str],
    manifest: Path,
    raw_dir: Path,
    runtime: HeadRuntimeSettings,
    in_memory_max_mb: float,
    out: Path,
    threads: int | None = None,
) -> list[dict]:
    """Score every run of ``head_names`` in ``head_dir`` (``source``'s heads) on ``target``'s
    features in ``manifest`` (the same encoder's states); write the records to ``out``."""
    if not target.shares_labels_with(source):
        raise ValueError(
            f"{source.name} and {target.name} do not share a label space ({source.meanings} vs {target.meanings})"
        )
    set_threads(threads)
    problems = Problems(target, manifest, runtime, in_memory_max_mb, raw_dir)
    records = []
    for run in head_runs(head_dir):
        record = read_json(run / HEAD_METRICS)
        if record["head"] not in head_names or raced_out(record):  # a head its race stopped is no candidate
            continue
        problem = problems.get(record["head_spec"])
        layers, hidden = problem.shape
        head = load_head(run, layers, hidden, source.num_labels)
        model = RelabeledHead(head, source=source, target=target).to(problems.device).eval()
        metrics, _, _ = problem.evaluate(model, None)
        records.append(
            {
                "backbone": record["source"]["model"],
                "source_task": source.name,
                "task": target.name,
                "head": record["head"],
                "ft_seed": record["source"]["ft_seed"],
                "seed": record["seed"],
                "checkpoint": str(record["source"]["checkpoint"]),
                "parameters": record["parameters"],
                "source_selection": source.primary_score(record["metrics"], "selection"),
                "metrics": metrics,
            }
        )
    log.info("%s heads on %s: %d runs scored", source.name, target.name, len(records))
    atomic_write_json({"source_task": source.name, "task": target.name, "records": records}, out)
    return records
