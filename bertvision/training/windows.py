"""Ragged token-level features (span windows, or examples with token features) as padded,
masked batches."""

from __future__ import annotations

import numpy as np
import torch

from bertvision.features.store import WindowStates


def select_windows(windows: WindowStates, rows: np.ndarray) -> WindowStates:
    """The windows ``rows`` (in that order) of ``windows``, as a new WindowStates."""
    slices = [windows.window(i) for i in rows]
    offsets = np.concatenate([[0], np.cumsum([s.stop - s.start for s in slices])]).astype(np.int64)
    take = np.concatenate([np.arange(s.start, s.stop) for s in slices]) if len(rows) else np.zeros(0, np.int64)
    char_offsets = None if windows.char_offsets is None else windows.char_offsets[take]
    return WindowStates(windows.states[take], offsets, char_offsets, windows.labels[rows], windows.idx[rows])


def pad_windows(windows: WindowStates, rows: np.ndarray):
    """(x (B, T, L, H) float32, mask (B, T), labels) for the windows ``rows``."""
    lengths = windows.lengths[rows]
    width = int(lengths.max())
    layers, hidden = windows.states.shape[1:]
    x = np.zeros((len(rows), width, layers, hidden), dtype=np.float32)
    mask = np.zeros((len(rows), width), dtype=bool)
    for j, i in enumerate(rows):
        x[j, : lengths[j]] = windows.states[windows.window(i)]
        mask[j, : lengths[j]] = True
    return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(windows.labels[rows])


def length_batches(lengths: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Rows sorted by length, cut into batches of at most ``max_tokens`` padded tokens (at
    least one row each)."""
    order = np.argsort(lengths, kind="stable")
    batches, i = [], 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j + 1 - i) * lengths[order[j]] <= max_tokens:
            j += 1
        batches.append(order[i:j])
        i = j
    return batches
