"""The frozen encoder's forward passes that produce features: the summary-token ([CLS], <s>)
state of every layer, or every token's. The extract stage stores what they return; streamed
head training (``features/streamed.py``) feeds it to the heads directly."""

from __future__ import annotations

from pathlib import Path

import torch

from bertvision.models.encoder_io import SUMMARY_POSITION, load_encoder
from bertvision.runtime.device import autocast, check_simulated_oom


def frozen_encoder(checkpoint_dir: Path, device: torch.device):
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = load_encoder(str(checkpoint_dir)).to(device).eval()
    model.requires_grad_(False)
    return model


def cls_states(model, batch: dict, device, precision: str) -> torch.Tensor:
    """(B, layers, hidden) summary-token ([CLS], <s>) states of every hidden layer."""
    check_simulated_oom(len(batch["input_ids"]))
    with autocast(device, precision):
        out = model(**batch, output_hidden_states=True)
    return torch.stack([h[:, SUMMARY_POSITION] for h in out.hidden_states], dim=1)


def token_states(model, batch: dict, device, precision: str) -> torch.Tensor:
    """(B, T, layers, hidden) states of every token of every hidden layer."""
    check_simulated_oom(len(batch["input_ids"]))
    with autocast(device, precision):
        out = model(**batch, output_hidden_states=True)
    return torch.stack(out.hidden_states, dim=2)


def plain_forward(model, batch: dict, device, precision: str) -> torch.Tensor:
    """The same forward pass without keeping anything but the last layer (benchmark baseline)."""
    with autocast(device, precision):
        return model(**batch).last_hidden_state[:, SUMMARY_POSITION]


def as_stored(states: torch.Tensor) -> torch.Tensor:
    """``states`` rounded to float16 as the feature files hold them, back in float32 for the
    heads: streamed and stored heads see the same values."""
    return states.to(torch.float16).float()
