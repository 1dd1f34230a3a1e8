"""The metric registry: every score a task can report, by task kind, with what the reports
need to know about it. The example-task metrics are the standard GLUE ones: F1 is the binary
F1 of the positive class (label 1), not micro-F1 (which equals accuracy, the original's bug).
The span metrics are SQuAD 2.0's, computed together by ``evaluation.squad_metric`` on a 0-100
scale."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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


def f1_macro(pred, gold) -> float:
    """F1 of each class that occurs in gold or predictions, averaged with equal weights: a constant
    prediction scores low on imbalanced labels, where accuracy would reward it."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    classes = np.union1d(pred, gold)
    scores = [f1((pred == c).astype(int), (gold == c).astype(int)) for c in classes]
    return float(np.mean(scores)) if scores else 0.0


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
    """Average ranks from 0 (ties share the mean rank), as used by Spearman's rho."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts) - 1
    return ((last - counts + 1 + last) / 2.0)[inverse.reshape(-1)]


def pearson(pred, gold) -> float:
    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if pred.std() == 0 or gold.std() == 0:
        return 0.0
    return float(np.corrcoef(pred, gold)[0, 1])


def spearman(pred, gold) -> float:
    return pearson(_rank(np.asarray(pred, dtype=np.float64)), _rank(np.asarray(gold, dtype=np.float64)))


@dataclass(frozen=True)
class Metric:
    name: str
    # (predictions, gold) -> score, for example tasks; None for span metrics, which SQuAD
    # decoding computes together (evaluation.squad_metric.squad_v2_metrics).
    compute: Callable | None
    scale: float = 1.0  # the best score: 1 for GLUE metrics, 100 for SQuAD's
    # A score near zero means the model learned nothing (correlations); the tables flag it.
    zero_is_chance: bool = False
    # Answerability tasks (one row per context window): how a question's windows become one
    # prediction before scoring (a key of AGGREGATIONS). None: that task's primary rule.
    aggregation: str | None = None


CLASSIFICATION_METRICS = {
    m.name: m
    for m in [
        Metric("accuracy", accuracy),
        Metric("f1", f1),
        Metric("f1_macro", f1_macro),
        Metric("mcc", mcc, zero_is_chance=True),
        Metric("accuracy_any_no", accuracy, aggregation="any-no"),
        Metric("f1_any_no", f1, aggregation="any-no"),
    ]
}
# A regression's scores are real numbers: a label metric (accuracy, F1) on them would count exact
# matches of floats, and every choice made on it would be made on noise.
REGRESSION_METRICS = {
    m.name: m
    for m in [Metric("pearson", pearson, zero_is_chance=True), Metric("spearman", spearman, zero_is_chance=True)]
}
SPAN_METRICS = {
    name: Metric(name, None, scale=100.0)
    for name in ("f1", "exact", "HasAns_f1", "HasAns_exact", "NoAns_f1", "NoAns_exact")
}

# Task kind -> the metrics a task of that kind may report.
METRICS: dict[str, dict[str, Metric]] = {
    "classification": CLASSIFICATION_METRICS,
    "regression": REGRESSION_METRICS,
    "span": SPAN_METRICS,
}


def allowed_metrics(kind: str, answerability: bool = False) -> list[str]:
    """The metrics a task of ``kind`` may report; those that aggregate windows only for answerability."""
    return [name for name, m in METRICS[kind].items() if not m.aggregation or answerability]


def get_metric(kind: str, name: str) -> Metric:
    try:
        return METRICS[kind][name]
    except KeyError:
        known = sorted(METRICS.get(kind, {}))
        raise KeyError(f"no metric {name!r} for {kind} tasks; the registry has {known}") from None


def predictions_from_outputs(outputs: np.ndarray, kind: str) -> np.ndarray:
    """Model outputs (N, C) -> predicted labels (argmax) or scores (regression)."""
    outputs = np.asarray(outputs)
    return outputs.reshape(-1) if kind == "regression" else outputs.argmax(axis=-1)


def compute_metrics(task, pred, gold) -> dict[str, float]:
    """Every metric of an example ``task`` (a registry TaskSpec) on these predictions."""
    return {name: get_metric(task.kind, name).compute(pred, gold) for name in task.metrics}


def _by_question(values: np.ndarray, idx: np.ndarray, reduce) -> np.ndarray:
    """``reduce`` (np.maximum or np.minimum) of ``values`` over the windows of each question, in
    the order of the questions' first windows."""
    questions, first, inverse = np.unique(idx, return_index=True, return_inverse=True)
    out = np.full(len(questions), -np.inf if reduce is np.maximum else np.inf, dtype=np.float64)
    reduce.at(out, inverse.reshape(-1), values.astype(np.float64))
    return out[np.argsort(first)]


def best_window(outputs: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Answerable (0) where the question's most confident window says so: the largest margin
    logit[answerable] - logit[no answer] over its windows is >= 0; else no answer (1). Right for
    windows labelled by whether they hold the answer: a long context's other windows do not."""
    margin = outputs[:, 0] - outputs[:, 1]
    return (_by_question(margin, idx, np.maximum) < 0).astype(np.int64)


def any_window_says_no(outputs: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The original's rule (Gen-1 evaluation.py): no answer (1) where any window predicts it."""
    return _by_question(outputs.argmax(axis=-1), idx, np.maximum).astype(np.int64)


# Answerability: window outputs (N, 2) and their question ids -> one label per question.
AGGREGATIONS: dict[str, Callable] = {"best-window": best_window, "any-no": any_window_says_no}
PRIMARY_AGGREGATION = "best-window"


def question_labels(labels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """1 where none of a question's windows holds its whole answer (every window labelled "no
    answer"), per question in the order of their first windows. Windows are the training
    target; a question's gold label is the data's (``question_gold``)."""
    return _by_question(np.asarray(labels), idx, np.minimum).astype(np.int64)


def question_gold(questions) -> dict[int, int]:
    """A split's questions (raw rows: ``idx``, ``answer_texts``) -> their gold label: no answer
    (1) where the data gives the question no answer, else answerable (0). Not from the windows:
    a question whose answer no window wholly holds (a doc_stride shorter than the answer) is
    still answerable."""
    return {int(i): int(len(texts) == 0) for i, texts in zip(questions["idx"], questions["answer_texts"])}


def constant_score(task, gold) -> float:
    """The primary metric of the best constant prediction on these gold labels: every example the
    same class (the best class on this split: a ceiling for guessing, used to flag runs that learned
    nothing, never to choose), or for a regression a constant, which correlates with nothing."""
    gold = np.asarray(gold)
    metric = get_metric(task.kind, task.primary_metric)
    constants = np.unique(gold) if task.kind == "classification" else [0.0]
    return max((metric.compute(np.full(len(gold), c), gold) for c in constants), default=float("nan"))


def score(task, outputs, labels, idx, questions=None) -> dict[str, float]:
    """Every metric of an example ``task`` from model ``outputs`` (N, C) for the rows with these
    gold ``labels`` and example ids ``idx``, and ``constant_score``. Answerability tasks score
    questions against their gold label from ``questions`` (the split's raw rows; see
    ``question_gold``): each metric aggregates a question's windows by its rule first; the record
    adds the number of questions and ``answerable_no_window``, the answerable questions none of
    whose windows holds the whole answer (all their windows are "no answer" training targets)."""
    outputs = np.asarray(outputs)
    if not task.answerability:
        out = compute_metrics(task, predictions_from_outputs(outputs, task.kind), labels)
        return {**out, "constant_score": constant_score(task, labels)}
    if questions is None:
        raise ValueError(f"{task.name}: scoring answerability needs the split's questions (their gold answers)")
    idx = np.asarray(idx)
    ids = np.unique(idx, return_index=True)
    ids = ids[0][np.argsort(ids[1])]  # questions in the order of their first windows, as AGGREGATIONS give them
    by_data = question_gold(questions)
    missing = [int(i) for i in ids if int(i) not in by_data]
    if missing:
        raise ValueError(
            f"{task.name}: {len(missing)} scored questions are not in the split's questions, e.g. {missing[0]}"
        )
    gold = np.array([by_data[int(i)] for i in ids], dtype=np.int64)
    out = {}
    for name in task.metrics:
        metric = get_metric(task.kind, name)
        out[name] = metric.compute(AGGREGATIONS[metric.aggregation or PRIMARY_AGGREGATION](outputs, idx), gold)
    no_window = (gold == 0) & (question_labels(labels, idx) == 1)
    return {
        **out,
        "constant_score": constant_score(task, gold),
        "questions": len(ids),
        "answerable_no_window": int(no_window.sum()),
    }
