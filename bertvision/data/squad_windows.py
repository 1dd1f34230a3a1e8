"""SQuAD windows: question + context, the context cut into overlapping windows of at most
``max_length`` tokens with ``stride`` tokens of overlap, offsets kept to map tokens back to
characters. Each window's answer is the token span of the first gold answer, or [CLS]
(position 0) when the question has no answer or the answer is not wholly inside the window."""

from __future__ import annotations

import numpy as np
import pandas as pd


def answer_positions(offsets: np.ndarray, char_start: int | None, char_end: int | None) -> tuple[int, int]:
    """Token (start, end) of the characters [char_start, char_end) in a window; (0, 0) if absent.
    ``offsets``: (T, 2) character offsets, (-1, -1) for tokens outside the context."""
    if char_start is None:
        return 0, 0
    ctx = np.flatnonzero(offsets[:, 0] >= 0)
    if len(ctx) == 0 or offsets[ctx[0], 0] > char_start or offsets[ctx[-1], 1] < char_end:
        return 0, 0
    starts = ctx[offsets[ctx, 0] <= char_start]
    ends = ctx[offsets[ctx, 1] >= char_end]
    return int(starts[-1]), int(ends[0])


def build_windows(df: pd.DataFrame, tokenizer, max_length: int, stride: int) -> pd.DataFrame:
    """One row per window: ``example`` (row of ``df``), ``window``, token ids, type ids,
    ``offsets`` (flattened (T, 2), -1 outside the context), ``length``, ``start``, ``end``."""
    questions = [q.lstrip() for q in df["question"]]
    enc = tokenizer(
        questions,
        df["context"].tolist(),
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
        padding=False,
    )
    rows = []
    answer_texts, answer_starts = df["answer_texts"].tolist(), df["answer_starts"].tolist()
    window_counter: dict[int, int] = {}
    for i, example in enumerate(enc["overflow_to_sample_mapping"]):
        sequence_ids = enc.sequence_ids(i)
        offsets = np.asarray(enc["offset_mapping"][i], dtype=np.int32)
        offsets[[s != 1 for s in sequence_ids]] = -1
        texts, starts = answer_texts[example], answer_starts[example]
        char_start = int(starts[0]) if len(texts) else None
        char_end = char_start + len(texts[0]) if len(texts) else None
        start, end = answer_positions(offsets, char_start, char_end)
        window = window_counter.get(example, 0)
        window_counter[example] = window + 1
        rows.append(
            {
                "example": example,
                "window": window,
                "input_ids": np.asarray(enc["input_ids"][i], dtype=np.int32),
                "token_type_ids": np.asarray(enc["token_type_ids"][i], dtype=np.int8),
                "offsets": offsets.reshape(-1),
                "length": len(offsets),
                "start": start,
                "end": end,
            }
        )
    return pd.DataFrame(rows)
