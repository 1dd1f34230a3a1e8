"""Frozen forward passes over a tokenized split in length-sorted batches, shared by the
fine-tuning evaluation and the feature extraction."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from tqdm import tqdm

from bertvision.data.tokenized import TokenizedSplit, collate, sorted_batches
from bertvision.registry.metrics import predictions_from_outputs, score
from bertvision.runtime.device import autocast, to_device


def forward_batches(
    model,
    split: TokenizedSplit,
    batch_size: int,
    device: torch.device,
    precision: str,
    pad_id: int,
    desc: str = "forward",
) -> Iterator[tuple[np.ndarray, object]]:
    """Yield ``(rows, outputs)`` per batch; rows index into ``split``."""
    model.eval()
    batches = sorted_batches(split.lengths, batch_size)
    with torch.inference_mode():
        for rows in tqdm(batches, desc=desc, mininterval=10, unit="batch"):
            batch = to_device(collate(split, rows, pad_id), device)
            with autocast(device, precision):
                out = model(**batch, output_hidden_states=False)
            yield rows, out


def predict(model, split: TokenizedSplit, batch_size, device, precision, pad_id, desc="evaluate") -> np.ndarray:
    """Model outputs (N, C) in the split's row order."""
    outputs = np.zeros((len(split), model.config.num_labels), dtype=np.float32)
    for rows, out in forward_batches(model, split, batch_size, device, precision, pad_id, desc=desc):
        outputs[rows] = out.logits.float().cpu().numpy()
    return outputs


def predict_span(model, split: TokenizedSplit, batch_size, device, precision, pad_id, desc="evaluate") -> list:
    """Per window, its (T, 2) start/end logits over its real tokens."""
    out_logits: list = [None] * len(split)
    for rows, out in forward_batches(model, split, batch_size, device, precision, pad_id, desc=desc):
        both = torch.stack([out.start_logits, out.end_logits], dim=-1).float().cpu().numpy()
        for j, i in enumerate(rows):
            out_logits[i] = both[j, : split.lengths[i]]
    return out_logits


def evaluate_outputs(outputs: np.ndarray, split: TokenizedSplit, task, questions=None) -> tuple[dict, dict]:
    """Metrics and a predictions table for one split of an example ``task``; ``questions``: the
    split's raw rows (answerability tasks take each question's gold label from them)."""
    pred = predictions_from_outputs(outputs, task.kind)
    metrics = score(task, outputs, split.labels, split.idx, questions)
    table = {"idx": split.idx, "label": split.labels, "prediction": pred, "outputs": list(outputs)}
    return metrics, table
