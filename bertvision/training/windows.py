"""Ragged token-level features (span windows, or examples with token features): subsets and
length-sorted batches (padded batches: ``WindowStates.padded``, ``StreamedWindows.padded``)."""

from __future__ import annotations

import numpy as np

from bertvision.features.store import WindowStates


def select_windows(windows, rows: np.ndarray):
    """The windows ``rows`` (in that order) of ``windows``, as a new WindowStates (a streamed
    view: a narrower view)."""
    if not isinstance(windows, WindowStates):
        return windows.subset(rows)
    slices = [windows.window(i) for i in rows]
    offsets = np.concatenate([[0], np.cumsum([s.stop - s.start for s in slices])]).astype(np.int64)
    take = np.concatenate([np.arange(s.start, s.stop) for s in slices]) if len(rows) else np.zeros(0, np.int64)
    char_offsets = None if windows.char_offsets is None else windows.char_offsets[take]
    return WindowStates(windows.states[take], offsets, char_offsets, windows.labels[rows], windows.idx[rows])


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
