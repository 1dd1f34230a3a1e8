"""Cross-checkpoint transfer: heads trained on the hidden states of one checkpoint, evaluated
unchanged on the states of every checkpoint of the same fine-tuning run: once with the
input standardization it was trained with ("source"), and once standardized with the target
checkpoint's own train-split statistics ("target"). The diagonal with "source" re-evaluates
each head on its own features and must reproduce its own metrics."""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from bertvision.device import set_threads
from bertvision.heads import Standardized, build_head
from bertvision.io import atomic_write_json, read_json
from bertvision.tasks import TaskSpec

log = logging.getLogger(__name__)


def load_trained_head(run_dir: Path, layers: int, hidden: int, outputs: int) -> nn.Module:
    """A head saved by ``train_heads`` (``head.safetensors`` + ``metrics.json``) in eval mode."""
    record = read_json(Path(run_dir) / "metrics.json")
    state = load_file(str(Path(run_dir) / "head.safetensors"))
    head = build_head(record["head_spec"], layers, hidden, outputs)
    if "mean" in state:
        head = Standardized(head, state["mean"], 1.0 / state["inv_std"])
    head.load_state_dict(state)
    return head.eval()


def checkpoint_of(manifest: Path) -> str:
    return str(read_json(manifest)["source"]["checkpoint"])


def transfer(task: TaskSpec, head_dirs: list[Path], manifests: list[Path], raw_dir: Path, out: Path,
             settings: dict, threads: int | None = None) -> list[dict]:
    """Evaluate every head run under ``head_dirs`` (one train_heads output per checkpoint) on
    every checkpoint's features in ``manifests``; write the records to ``out``. ``settings``:
    the task's head training settings (device, feature verification, memory limit)."""
    from bertvision.train_head import Problems

    set_threads(threads)
    runs = sorted(p.parent for d in head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    records = []
    for manifest in manifests:
        target = checkpoint_of(manifest)
        problems = Problems(task, manifest, settings, raw_dir)
        for run in runs:
            record = read_json(run / "metrics.json")
            spec = record["head_spec"]
            problem = problems.get(spec)
            layers, hidden = problem.shape
            head = load_trained_head(run, layers, hidden, task.num_labels).to(problems.device)
            variants = {"source": head}
            if isinstance(head, Standardized):
                # The same weights with the input standardized by the target checkpoint's own
                # train-split statistics (no labels involved): undoes the shift in scale.
                variants["target"] = Standardized(head.head, *problems.moments(spec)).to(problems.device).eval()
            for standardization, model in variants.items():
                metrics, _, _ = problem.evaluate(model, None)
                records.append({"task": task.name, "head": record["head"], "seed": record["seed"],
                                "trained_on": str(record["source"]["checkpoint"]), "evaluated_on": target,
                                "standardization": standardization,
                                "metrics": {s: m for s, m in metrics.items() if s in task.eval_splits}})
        log.info("evaluated %d heads on checkpoint %s", len(runs), target)
    atomic_write_json({"task": task.name, "records": records}, out)
    return records
