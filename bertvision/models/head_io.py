"""A trained head on disk: its weights (safetensors, with the input and label standardization
buffers when it has them) beside the ``metrics.json`` record that holds its spec."""

from __future__ import annotations

import logging
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from bertvision.files import atomic_path, read_json
from bertvision.layout import HEAD_METRICS, HEAD_WEIGHTS
from bertvision.models.heads import build_head, core_head, standardized
from bertvision.registry.states import PAIR_PARTS

log = logging.getLogger(__name__)


def save_head(head: nn.Module, head_name: str, spec: dict, run_dir: Path) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(run_dir) / HEAD_WEIGHTS) as tmp:
        save_file(
            {k: v.contiguous().cpu() for k, v in head.state_dict().items()},
            str(tmp),
            metadata={"head": head_name, "type": spec["type"]},
        )


def load_head(run_dir: Path, layers: int, hidden: int, outputs: int) -> nn.Module:
    """A head saved by ``train_heads`` in eval mode."""
    record = read_json(Path(run_dir) / HEAD_METRICS)
    state = load_file(str(Path(run_dir) / HEAD_WEIGHTS))
    head = build_head(record["head_spec"], layers, hidden, outputs)
    moments = (state["mean"], 1.0 / state["inv_std"]) if "mean" in state else None
    label_moments = (state["label_mean"], state["label_std"]) if "label_mean" in state else None
    head = standardized(head, moments, label_moments)
    head.load_state_dict(state)
    if moments is not None and getattr(core_head(head), "sides_alike", False) and not _alike(state["mean"]):
        # the buffers it was scored with are kept: re-pooling them would answer otherwise than it was evaluated
        log.warning(
            "%s: a %s head saved before its pair's two sides were standardized alike: it scores (a, b) and "
            "(b, a) differently; train it again (its train_heads job) for one score either way round",
            run_dir,
            record["head_spec"]["type"],
        )
    return head.eval()


def _alike(mean) -> bool:
    side = mean.shape[-1] // len(PAIR_PARTS)
    return bool((mean[..., :side] == mean[..., side : 2 * side]).all())
