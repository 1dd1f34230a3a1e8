"""The frozen encoder's forward passes that produce features: the summary-token ([CLS], <s>)
state and the mean over real tokens of every layer, or every token's. The extract stage stores
what they return; streamed head training (``features/streamed.py``) feeds it to the heads
directly."""

from __future__ import annotations

from pathlib import Path

import torch

from bertvision.models.encoder_io import SUMMARY_POSITION, load_encoder, load_task_model
from bertvision.registry.states import READS
from bertvision.runtime.backend import with_backend
from bertvision.runtime.device import autocast, check_simulated_oom


def frozen_encoder(checkpoint_dir: Path, device: torch.device, backend: str = "torch", precision: str = "fp32"):
    """The checkpoint's bare encoder, frozen, run by ``backend`` (``runtime.precision.BACKENDS``;
    ``auto`` measures PyTorch in ``precision``, the precision its passes will take)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = load_encoder(str(checkpoint_dir)).to(device).eval()
    model.requires_grad_(False)
    return with_backend(model, backend, precision=precision)


def frozen_task_model(
    checkpoint_dir: Path, kind: str, device: torch.device, backend: str = "torch", precision: str = "fp32"
):
    """The checkpoint's encoder with its own task head (BERT's), frozen: one pass gives the
    states the bare encoder would and the head's outputs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = load_task_model(str(checkpoint_dir), kind).to(device).eval()
    model.requires_grad_(False)
    return with_backend(model, backend, precision=precision)


def encoder_pass(model, batch: dict, device, precision: str):
    """One forward pass: the hidden states of every layer, and a task model's head outputs
    (float32 on the device: (B, C) logits, or (B, T, 2) start/end logits of a span head; None
    for a bare encoder), as ``evaluation.inference`` takes them."""
    check_simulated_oom(len(batch["input_ids"]))
    with autocast(device, precision):
        out = model(**batch, output_hidden_states=True)
    if getattr(out, "logits", None) is not None:
        head = out.logits.float()
    elif getattr(out, "start_logits", None) is not None:
        head = torch.stack([out.start_logits, out.end_logits], dim=-1).float()
    else:
        head = None
    return out.hidden_states, head


def cls_of(hidden_states) -> torch.Tensor:
    """(B, layers, hidden) summary-token ([CLS], <s>) states of every hidden layer."""
    return torch.stack([h[:, SUMMARY_POSITION] for h in hidden_states], dim=1)


def mean_of(hidden_states, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, layers, hidden) float32: every hidden layer's states averaged over each row's real
    tokens (``attention_mask`` 1; padding never counts), sentence-transformers' mean pooling
    applied to every layer."""
    mask = attention_mask.to(torch.float32)[:, :, None]
    counts = mask.sum(1).clamp(min=1)
    return torch.stack([(h.float() * mask).sum(1) / counts for h in hidden_states], dim=1)


def per_example_states(hidden_states, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a per-example head may read (``registry.states.READS``): 'cls' and 'mean', each
    (B, layers, hidden)."""
    states = {"cls": cls_of(hidden_states), "mean": mean_of(hidden_states, attention_mask)}
    return {reads: states[reads] for reads in READS}


def pair_features(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, layers, len(PAIR_PARTS) x hidden) float32 from each side's (B, layers, hidden) states
    (as stored: float16 values), so that the extraction and the service compute the same."""
    u, v = u.float(), v.float()
    return torch.cat([u, v, (u - v).abs(), u * v], dim=-1)


def cls_states(model, batch: dict, device, precision: str) -> torch.Tensor:
    """(B, layers, hidden) summary-token ([CLS], <s>) states of every hidden layer."""
    return cls_of(encoder_pass(model, batch, device, precision)[0])


def example_states(model, batch: dict, device, precision: str, reads: str) -> torch.Tensor:
    """(B, layers, hidden) states of every hidden layer as a head that ``reads`` them sees."""
    hidden_states = encoder_pass(model, batch, device, precision)[0]
    return per_example_states(hidden_states, batch["attention_mask"])[reads]


def token_states(model, batch: dict, device, precision: str) -> torch.Tensor:
    """(B, T, layers, hidden) states of every token of every hidden layer."""
    return torch.stack(encoder_pass(model, batch, device, precision)[0], dim=2)


def plain_forward(model, batch: dict, device, precision: str) -> torch.Tensor:
    """The same forward pass without keeping anything but the last layer (benchmark baseline)."""
    with autocast(device, precision):
        return model(**batch).last_hidden_state[:, SUMMARY_POSITION]


def as_stored(states: torch.Tensor) -> torch.Tensor:
    """``states`` rounded to float16 as the feature files hold them, back in float32 for the
    heads: streamed and stored heads see the same values."""
    return states.to(torch.float16).float()
