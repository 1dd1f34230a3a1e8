"""SQuAD 2.0 exact match and F1 exactly as the official ``evaluate-v2.0.py`` defines them:
answers normalised (lower case, punctuation and the articles a/an/the removed, whitespace
collapsed), the maximum over gold answers, and an unanswerable question (no gold answer
with a non-empty normalised text) scored against the empty answer."""

from __future__ import annotations

import collections
import re
import string

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1(gold: str, pred: str) -> float:
    gold_toks, pred_toks = _tokens(gold), _tokens(pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def gold_answers(texts) -> list[str]:
    answers = [t for t in texts if normalize_answer(t)]
    return answers or [""]


def score_question(texts, pred: str) -> tuple[int, float]:
    golds = gold_answers(texts)
    return max(exact(g, pred) for g in golds), max(f1(g, pred) for g in golds)


def squad_v2_metrics(gold_texts: list, predictions: list[str]) -> dict[str, float]:
    """``exact``/``f1`` overall and for HasAns/NoAns questions, on the 0-100 scale."""
    if len(gold_texts) != len(predictions):
        raise ValueError(f"{len(gold_texts)} questions but {len(predictions)} predictions")
    sums = collections.defaultdict(float)
    counts = collections.Counter()
    for texts, pred in zip(gold_texts, predictions):
        em, f = score_question(texts, pred)
        group = "HasAns" if len(texts) else "NoAns"  # as the official script: any gold answer
        for key in ("", group + "_"):
            sums[key + "exact"] += em
            sums[key + "f1"] += f
            counts[key] += 1
    out = {
        "exact": 100.0 * sums["exact"] / max(counts[""], 1),
        "f1": 100.0 * sums["f1"] / max(counts[""], 1),
        "total": counts[""],
    }
    for group in ("HasAns", "NoAns"):
        if counts[group + "_"]:
            out[f"{group}_exact"] = 100.0 * sums[f"{group}_exact"] / counts[group + "_"]
            out[f"{group}_f1"] = 100.0 * sums[f"{group}_f1"] / counts[group + "_"]
            out[f"{group}_total"] = counts[group + "_"]
    return out
