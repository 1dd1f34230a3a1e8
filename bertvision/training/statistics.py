"""Input statistics and training subsets for head training."""

from __future__ import annotations

import numpy as np
import torch

SUM_VALUES = 1 << 18  # float64 values summed at once (2 MiB)


def even_pieces(chunks, max_values: int):
    """The rows of ``chunks`` (arrays, rows along the first axis) again, in pieces of the same
    number of rows, at most ``max_values`` values each (at least one row; the last piece
    shorter): sums over the pieces depend on the rows only, not on how the chunks were cut."""
    pending, held, rows = [], 0, None
    for chunk in chunks:
        if rows is None:
            rows = max(1, max_values // max(1, int(np.prod(chunk.shape[1:]))))
        start = 0
        while start < len(chunk):
            take = min(rows - held, len(chunk) - start)
            pending.append(chunk[start : start + take])
            held, start = held + take, start + take
            if held == rows:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, held = [], 0
    if held:
        yield np.concatenate(pending)


def moments(chunks, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sample std over the first axis of float16 chunks, accumulated in float64 a few
    MiB at a time, in the same pieces however the chunks are cut."""
    total = total_sq = 0.0
    for piece in even_pieces(chunks, SUM_VALUES):
        x = piece.astype(np.float64)
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
    """Mean and std over every real token of ``windows``: in memory, read from the shards
    block by block, or computed by the encoder (one pass, ``batch_size`` rows at a time)."""
    return moments(windows.token_chunks(batch_size), int(windows.lengths.sum()), device)
