"""Head + BERT ensembles at the same checkpoint: the element-wise max (the original's choice)
or the mean of the two models' softmax distributions, over classes (classification) or over
a window's token positions for start and end separately (span). Regression averages the two
predictions. Per-split logits are stored as ``eval_logits.npz``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bertvision.files import atomic_path


def save_logits(path: Path, logits: dict[str, list | np.ndarray]) -> None:
    """``logits``: split -> a (N, C) array, or a list of (T_i, 2) arrays (span windows)."""
    arrays = {}
    for split, value in logits.items():
        parts = list(value)
        arrays[f"{split}/values"] = np.concatenate([np.atleast_2d(p) for p in parts]) if parts else np.zeros((0, 1))
        arrays[f"{split}/lengths"] = np.array([len(np.atleast_2d(p)) for p in parts], dtype=np.int64)
    with atomic_path(Path(path)) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def load_logits(path: Path) -> dict[str, list[np.ndarray]]:
    """split -> list of per-row arrays ((1, C) for examples, (T, 2) for windows)."""
    with np.load(path) as data:
        splits = {key.split("/")[0] for key in data.files}
        return {s: _rows(data[f"{s}/values"], data[f"{s}/lengths"]) for s in splits}


def _rows(values: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    # np.split of an empty array at no index gives one empty part, not none: a split with no rows
    # (an extraction shard past the end of a small split) has no rows here
    return np.split(values, np.cumsum(lengths)[:-1]) if len(lengths) else []


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def combine(a: np.ndarray, b: np.ndarray, how: str, axis: int) -> np.ndarray:
    """Log of the combined distribution (max or mean of the two softmaxes along ``axis``)."""
    pa, pb = softmax(a, axis), softmax(b, axis)
    p = np.maximum(pa, pb) if how == "max" else (pa + pb) / 2
    return np.log(p + 1e-12)


ENSEMBLES = ("max", "mean")


def prediction_column(how: str | None = None) -> str:
    """The column of a head run's eval predictions file that holds the head's predictions, or with
    ``how`` those of its head + BERT ensemble."""
    return "prediction" if how is None else f"prediction_{how}"


def ensemble_rules(task) -> tuple[str, ...]:
    """The ensembles that differ for ``task``: regression averages the two predictions; with
    two classes the max and the mean of the softmaxes always pick the same class (class 1
    wins under either iff p_head + p_bert > 1), so only the mean is kept."""
    if task.kind == "regression" or (task.kind == "classification" and task.num_labels == 2):
        return ("mean",)
    return ENSEMBLES


def ensemble_windows(head: list[np.ndarray], bert: list[np.ndarray], how: str) -> list[np.ndarray]:
    if len(head) != len(bert) or any(h.shape != b.shape for h, b in zip(head, bert)):
        raise ValueError("head and BERT logits cover different windows")
    return [combine(h, b, how, axis=0) for h, b in zip(head, bert)]


def ensemble_examples(head: np.ndarray, bert: np.ndarray, how: str, kind: str) -> np.ndarray:
    if head.shape != bert.shape:
        raise ValueError(f"head outputs {head.shape} and BERT outputs {bert.shape} differ")
    if kind == "regression":
        return (head + bert) / 2
    return combine(head, bert, how, axis=-1)
