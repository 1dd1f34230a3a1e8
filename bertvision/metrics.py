"""The standard GLUE metrics, by name. F1 is the binary F1 of the positive class (label 1),
not micro-F1 (which equals accuracy, the original's bug)."""

from __future__ import annotations

import math

import numpy as np


def accuracy(pred, gold) -> float:
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float((pred == gold).mean())


def f1(pred, gold) -> float:
    pred, gold = np.asarray(pred), np.asarray(gold)
    tp = int(((pred == 1) & (gold == 1)).sum())
    fp = int(((pred == 1) & (gold != 1)).sum())
    fn = int(((pred != 1) & (gold == 1)).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def mcc(pred, gold) -> float:
    """Matthews correlation for any number of classes (Gorodkin's R_K, as sklearn computes it)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    classes = np.union1d(pred, gold)
    conf = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(conf, (np.searchsorted(classes, gold), np.searchsorted(classes, pred)), 1)
    t, p = conf.sum(axis=1), conf.sum(axis=0)
    c, s = np.trace(conf), conf.sum()
    denom = math.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    return 0.0 if denom == 0 else float((c * s - (t * p).sum()) / denom)


def _rank(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), as used by Spearman's rho."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def pearson(pred, gold) -> float:
    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if pred.std() == 0 or gold.std() == 0:
        return 0.0
    return float(np.corrcoef(pred, gold)[0, 1])


def spearman(pred, gold) -> float:
    return pearson(_rank(np.asarray(pred, dtype=np.float64)), _rank(np.asarray(gold, dtype=np.float64)))


METRICS = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


def predictions_from_outputs(outputs: np.ndarray, kind: str) -> np.ndarray:
    """Model outputs (N, C) -> predicted labels (argmax) or scores (regression)."""
    outputs = np.asarray(outputs)
    return outputs.reshape(-1) if kind == "regression" else outputs.argmax(axis=-1)


def compute_metrics(names, pred, gold) -> dict[str, float]:
    return {name: METRICS[name](pred, gold) for name in names}
