"""BERT's own head's outputs, kept by an extraction that ran the checkpoint's task model: per shard,
the outputs on its rows of the scored splits (``SHARD_BERT_LOGITS``) and the seconds the pass spent
on each of them (``SHARD_BERT_PASS``, BERT's share of the extraction in its whole cost). The
extraction writes them (``save``); rule score_bert reads them back over every shard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bertvision.data.tokenized import TokenizedSplit
from bertvision.errors import FeatureError
from bertvision.evaluation.ensemble import load_logits, save_logits
from bertvision.files import atomic_write_json, read_json
from bertvision.layout import SHARD_BERT_LOGITS, SHARD_BERT_PASS


class HeadOutputs:
    """The task head's outputs on a shard's rows of one split, in row order: a (C,) row of logits
    per example, or a window's (T, 2) start/end logits over its real tokens."""

    def __init__(self, split: TokenizedSplit, start: int, end: int):
        self.split, self.start = split, start
        self.rows: list = [None] * (end - start)

    def keep(self, rows: np.ndarray, head: torch.Tensor) -> None:
        values = head.cpu().numpy()
        for j, i in enumerate(rows):
            self.rows[i - self.start] = values[j] if values.ndim == 2 else values[j, : self.split.lengths[i]]


def save(shard_dir: Path, outputs: dict[str, HeadOutputs], seconds: dict[str, float], computed_in: str) -> None:
    """A shard's outputs (split -> HeadOutputs), the pass's ``seconds`` on each of those splits and
    what it computed in (``runtime.precision.computed_in``: "fp32 (ONNX Runtime)")."""
    save_logits(Path(shard_dir) / SHARD_BERT_LOGITS, {split: kept.rows for split, kept in outputs.items()})
    atomic_write_json(
        {"seconds": {split: seconds[split] for split in outputs}, "computed_in": computed_in},
        Path(shard_dir) / SHARD_BERT_PASS,
    )


def pass_computed_in(shard_dirs: list[Path]) -> str | None:
    """What the extraction's pass computed BERT's outputs in (None: shards from before it was kept)."""
    return read_json(Path(shard_dirs[0]) / SHARD_BERT_PASS).get("computed_in")


def joined_outputs(shard_dirs: list[Path], splits: dict[str, TokenizedSplit], kind: str) -> dict:
    """split -> the outputs every shard kept, joined in shard order: (N, C) for example tasks, one
    (T, 2) array per window for span tasks; a shard set that misses rows fails naming the file."""
    parts = [load_logits(Path(d) / SHARD_BERT_LOGITS) for d in shard_dirs]
    outputs = {}
    for split, tokens in splits.items():
        rows = [row for part in parts for row in part.get(split, [])]
        if len(rows) != len(tokens):
            raise FeatureError(
                f"{Path(shard_dirs[0]) / SHARD_BERT_LOGITS}: BERT's outputs on {split} cover {len(rows)} rows over "
                f"{len(shard_dirs)} shard(s); the split has {len(tokens)} (extract with --bert-logits again)"
            )
        outputs[split] = rows if kind == "span" else np.concatenate(rows)
    return outputs


def pass_seconds(shard_dirs: list[Path], splits) -> float:
    """The seconds the extraction's pass spent on ``splits`` over every shard: BERT's share of it
    (an upper bound: the same pass computed those splits' states)."""
    return float(sum(read_json(Path(d) / SHARD_BERT_PASS)["seconds"][split] for d in shard_dirs for split in splits))
