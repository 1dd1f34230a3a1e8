"""Length-aware batching: examples are grouped with others of similar length and padded per
batch, never to the task's max length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch


class TokenizedSplit:
    """A tokenized split held as ragged arrays: one row per example, or per context window for
    span tasks (then ``idx`` is the window's question row, ``labels`` its (start, end)
    token positions and ``offsets`` its (T, 2) character offsets, -1 outside the context).
    ``token_type_ids`` is None where the encoder takes none (``encoder_io.uses_token_types``)."""

    def __init__(self, df: pd.DataFrame):
        self.input_ids = list(df["input_ids"])
        self.token_type_ids = list(df["token_type_ids"]) if "token_type_ids" in df.columns else None
        self.lengths = df["length"].to_numpy().astype(np.int64)
        if "start" in df.columns:
            self.idx = df["example"].to_numpy()
            self.labels = np.stack([df["start"].to_numpy(), df["end"].to_numpy()], axis=1).astype(np.int64)
            self.offsets = [np.asarray(o).reshape(-1, 2) for o in df["offsets"]]
        else:
            self.idx = df["idx"].to_numpy()
            self.labels = df["label"].to_numpy()
            self.offsets = None
        # a pair task encoded apart: each row's two texts, rows of its split's texts file
        self.sides = df[["text_a", "text_b"]].to_numpy() if "text_a" in df.columns else None

    @classmethod
    def read(cls, path: Path) -> TokenizedSplit:
        return cls(pd.read_parquet(path))

    def __len__(self) -> int:
        return len(self.lengths)


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Deterministic batches of rows sorted by length (inference)."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def bucketed_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, bucket_batches: int = 50):
    """Shuffled training batches: shuffle, cut into buckets of ``bucket_batches`` batches, sort
    each bucket by length, cut into batches, then shuffle the order of the batches."""
    perm = rng.permutation(len(lengths))
    bucket = batch_size * bucket_batches
    batches = []
    for start in range(0, len(perm), bucket):
        chunk = perm[start : start + bucket]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def shuffled_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled training batches: a permutation of the rows, cut in order."""
    order = rng.permutation(len(lengths))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def length_batches(
    lengths: np.ndarray, max_tokens: int, max_rows: int | None = None, multiple_of: int = 1
) -> list[np.ndarray]:
    """Rows sorted by length, cut into batches of at most ``max_tokens`` padded tokens (each batch
    padded to a multiple of ``multiple_of``, as ``collate`` pads it) and ``max_rows`` rows (at least
    one row each)."""
    order = np.argsort(lengths, kind="stable")
    lengths = -(-np.asarray(lengths) // multiple_of) * multiple_of
    max_rows = len(order) if max_rows is None else max_rows
    batches, i = [], 0
    while i < len(order):
        j = i + 1
        while j < len(order) and j - i < max_rows and (j + 1 - i) * lengths[order[j]] <= max_tokens:
            j += 1
        batches.append(order[i:j])
        i = j
    return batches


# How each task kind's labels enter a Hugging Face model's forward().
LABEL_TENSORS = {
    "classification": lambda y: {"labels": torch.as_tensor(y, dtype=torch.long)},
    "regression": lambda y: {"labels": torch.as_tensor(y, dtype=torch.float32)},
    "span": lambda y: {"start_positions": torch.as_tensor(y[:, 0]), "end_positions": torch.as_tensor(y[:, 1])},
}


def collate(
    split: TokenizedSplit, rows: np.ndarray, pad_id: int, kind: str | None = None, multiple_of: int = 1
) -> dict[str, torch.Tensor]:
    """A padded batch, with token type ids where the split has them; with ``kind``, plus that
    kind's label tensors. ``multiple_of``: pad the width up to a multiple of it."""
    width = -(-int(split.lengths[rows].max()) // multiple_of) * multiple_of
    n = len(rows)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((n, width), dtype=np.int64)
    for j, i in enumerate(rows):
        length = split.lengths[i]
        input_ids[j, :length] = split.input_ids[i]
        attention_mask[j, :length] = 1
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask)}
    if split.token_type_ids is not None:
        token_type_ids = np.zeros((n, width), dtype=np.int64)
        for j, i in enumerate(rows):
            token_type_ids[j, : split.lengths[i]] = split.token_type_ids[i]
        batch["token_type_ids"] = torch.from_numpy(token_type_ids)
    if kind is not None:
        batch.update(LABEL_TENSORS[kind](split.labels[rows]))
    return batch


def padding_ratio(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """Padded tokens / real tokens over a list of batches (1.0 = no padding)."""
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    return padded / int(lengths.sum())
