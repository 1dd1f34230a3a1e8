"""Texts to token ids, as the tokenize stage stores them and the server encodes its requests: one
row per example, no padding stored."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd


def tokenize_frame(df: pd.DataFrame, task, tokenizer, max_length: int) -> pd.DataFrame:
    texts = [df[name].tolist() for name in task.text_fields]
    enc = tokenizer(
        *texts,
        truncation="longest_first",
        max_length=max_length,
        padding=False,
        return_token_type_ids=True,
        return_attention_mask=False,
    )
    lengths = np.fromiter((len(ids) for ids in enc["input_ids"]), dtype=np.int32, count=len(df))
    return pd.DataFrame(
        {
            "idx": df["idx"].to_numpy(),
            "input_ids": [np.asarray(x, dtype=np.int32) for x in enc["input_ids"]],
            "token_type_ids": [np.asarray(x, dtype=np.int8) for x in enc["token_type_ids"]],
            "length": lengths,
            "label": df["label"].to_numpy(),
        }
    )


def tokenize_apart(df: pd.DataFrame, task, tokenizer, max_length: int) -> tuple[pd.DataFrame, np.ndarray]:
    """A pair task's texts each tokenized alone, as a bi-encoder reads them: (one row per
    distinct text, its ``idx`` its row number; (n, 2) the rows of each example's two texts).
    MRPC and STS-B repeat sentences: each is tokenized, and later encoded, once."""
    first, second = (df[name].tolist() for name in task.text_fields)
    distinct = list(dict.fromkeys(first + second))
    row = {text: i for i, text in enumerate(distinct)}
    sides = np.array([[row[a], row[b]] for a, b in zip(first, second)], dtype=np.int64).reshape(-1, 2)
    texts = pd.DataFrame({"text": distinct, "idx": np.arange(len(distinct)), "label": 0})
    return tokenize_frame(texts, SimpleNamespace(text_fields=("text",)), tokenizer, max_length), sides
