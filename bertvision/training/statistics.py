"""Input statistics and training subsets for head training."""

from __future__ import annotations

import numpy as np
import torch


def moments(chunks, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sample std over the first axis of float16 chunks, accumulated in float64."""
    total = total_sq = 0.0
    for chunk in chunks:
        for i in range(0, len(chunk), 65536):
            x = chunk[i : i + 65536].astype(np.float64)
            total = total + x.sum(0)
            total_sq = total_sq + (x * x).sum(0)
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1))
    return (torch.from_numpy(mean.astype(np.float32)).to(device), torch.from_numpy(std.astype(np.float32)).to(device))


def nested_subset(n: int, fraction: float, seed: int = 0) -> np.ndarray | None:
    """Sorted rows of a seeded ``fraction`` of ``range(n)`` (None = all). Smaller fractions are
    subsets of larger ones, so a data-fraction curve adds data rather than redrawing it."""
    if fraction >= 1.0:
        return None
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[: max(1, int(round(fraction * n)))])


def token_moments(windows, device, batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std over every real token of ``windows``: a ``WindowStates`` in memory, or a
    streamed view (one encoder pass over it)."""
    if hasattr(windows, "states"):
        return moments([windows.states], len(windows.states), device)
    return moments(windows.token_chunks(batch_size), int(windows.lengths.sum()), device)
