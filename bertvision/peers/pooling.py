"""The sentence embedding a backbone declares: sentence-transformers' layout (``modules.json``
naming a Pooling module, its ``config.json``, and a Normalize module), read from the backbone's
folder or, for a hub id, from the hub cache; mean over real tokens, unnormalised, when it
declares none. Pooling here is ours (a few lines of torch) so that the same states the pipeline
runs are pooled, without loading the encoder a second time through sentence-transformers."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)
APPLIED = ("Transformer", "Pooling", "Normalize")  # the layout's modules the embedding runs

# sentence-transformers' pooling modes; its older configs' keys name them in the order it concatenates them
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class Pooling:
    modes: tuple[str, ...]  # MODES, concatenated in this order
    normalize: bool
    declared_by: str  # the file of the backbone's folder that declared it, or why the fallback applies

    def to_dict(self) -> dict:
        return {"modes": list(self.modes), "normalize": self.normalize, "declared_by": self.declared_by}


MEAN_FALLBACK = "the backbone declares no sentence-transformers pooling: mean over real tokens"


def _layout_file(source: str, name: str) -> Path | None:
    """``name`` inside the backbone folder ``source``, or None."""
    path = Path(source) / name
    return path if path.exists() else None


def declared_pooling(source: str) -> Pooling:
    """The pooling of the backbone in the folder ``source`` (``backbone.resolve_pretrained``)."""
    modules_file = _layout_file(source, "modules.json")
    if modules_file is None:
        return Pooling(("mean",), False, MEAN_FALLBACK)
    modules = json.loads(modules_file.read_text())
    types = [m["type"].rsplit(".", 1)[-1] for m in modules]
    normalize = "Normalize" in types
    others = [t for t in types if t not in APPLIED]
    if others:  # a Dense projection (LaBSE's), say: the embedding is not the one sentence-transformers gives
        log.warning("%s: modules %s are not applied: the embedding peer's vectors differ from "
                    "sentence-transformers' for this backbone", modules_file, ", ".join(others))  # fmt: skip
    if "Pooling" not in types:
        return Pooling(("mean",), normalize, "modules.json: no Pooling module, so mean over real tokens")
    entry = modules[types.index("Pooling")]
    config_file = _layout_file(source, f"{entry['path']}/config.json".lstrip("/"))
    if config_file is None:
        raise FileNotFoundError(f"{modules_file}: its Pooling module's {entry['path']}/config.json is missing")
    config = json.loads(config_file.read_text())
    declared = config.get("pooling_mode")  # sentence-transformers 6: a mode or a list, in concatenation order
    if declared is not None:
        modes = (declared,) if isinstance(declared, str) else tuple(declared)
    else:  # the older one flag per mode; none set is mean, as sentence-transformers reads it
        modes = tuple(mode for key, mode in LEGACY_KEYS.items() if config.get(key)) or ("mean",)
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise ValueError(f"{config_file}: pooling {unknown or 'none'} is not one of {', '.join(MODES)}")
    # relative to the backbone's folder, so that a record reads alike wherever the backbone lies
    return Pooling(modes, normalize, config_file.relative_to(source).as_posix())


def pool(states: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """(B, T, H) token states and their (B, T) attention mask -> (B, H x modes) sentence embeddings."""
    mask_f = mask.unsqueeze(-1).to(states.dtype)
    counts = mask_f.sum(1).clamp(min=1)
    parts = []
    for mode in pooling.modes:
        if mode == "cls":
            parts.append(states[:, 0])
        elif mode == "mean":
            parts.append((states * mask_f).sum(1) / counts)
        elif mode == "max":
            parts.append(states.masked_fill(mask_f == 0, torch.finfo(states.dtype).min).max(1).values)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((states * mask_f).sum(1) / counts.sqrt())
        elif mode == "weightedmean":  # token i of the real ones weighs i (padding is on the right)
            weights = mask_f * torch.arange(1, states.shape[1] + 1, dtype=states.dtype).view(1, -1, 1)
            parts.append((states * weights).sum(1) / weights.sum(1).clamp(min=1))
        else:  # lasttoken: the last real token's state
            last = (mask.sum(1) - 1).clamp(min=0)
            parts.append(states[torch.arange(len(states)), last])
    out = torch.cat(parts, dim=-1)
    return torch.nn.functional.normalize(out, dim=-1) if pooling.normalize else out
