"""Texts to token ids, as the tokenize stage stores them and the server encodes its requests: one
row per example, no padding stored."""

from __future__ import annotations

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
