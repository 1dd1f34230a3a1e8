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

from bertvision.device import pick_device, set_threads
from bertvision.features import FeatureSet
from bertvision.heads import Standardized, build_head
from bertvision.io import atomic_write_json, read_json
from bertvision.tasks import TaskSpec, splits_of

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
             threads: int | None = None, settings: dict | None = None) -> list[dict]:
    """Evaluate every head run under ``head_dirs`` (one train_heads output per checkpoint) on
    every checkpoint's features in ``manifests``; write the records to ``out``."""
    from bertvision.train_head import problem_class

    set_threads(threads)
    settings = {"in_memory_max_mb": 4096, **(settings or {})}
    device = pick_device("cpu")
    runs = sorted(p.parent for d in head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    records = []
    for manifest in manifests:
        target = checkpoint_of(manifest)
        feats = {split: FeatureSet.open(manifest, split, verify="size") for split in splits_of(task)}
        problems: dict = {}  # per problem class ([CLS] or token-level heads), built once per checkpoint
        moments: dict = {}
        for run in runs:
            record = read_json(run / "metrics.json")
            cls = problem_class(task, record["head_spec"])
            if cls not in problems:
                problems[cls] = cls(task, feats, settings, device, raw_dir)
            problem = problems[cls]
            layers, hidden = problem.shape
            head = load_trained_head(run, layers, hidden, task.num_labels).to(device)
            variants = {"source": head}
            if isinstance(head, Standardized):
                # The same weights with the input standardized by the target checkpoint's own
                # train-split statistics (no labels involved): undoes the shift in scale.
                if cls not in moments:
                    moments[cls] = problem.moments()
                variants["target"] = Standardized(head.head, *moments[cls]).to(device).eval()
            for standardization, model in variants.items():
                metrics, _, _ = problem.evaluate(model, None)
                records.append({"task": task.name, "head": record["head"], "seed": record["seed"],
                                "trained_on": str(record["source"]["checkpoint"]), "evaluated_on": target,
                                "standardization": standardization,
                                "metrics": {s: m for s, m in metrics.items() if s in task.eval_splits}})
        log.info("evaluated %d heads on checkpoint %s", len(runs), target)
    atomic_write_json({"task": task.name, "records": records}, out)
    return records
