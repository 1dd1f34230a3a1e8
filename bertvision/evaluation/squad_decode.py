"""From per-window start/end logits to one answer per question.

For each question, over all its windows: the ``n_best`` start and ``n_best`` end positions
inside the context, pairs with end >= start and at most ``max_answer_length`` tokens, scored
by the sum of their logits. The null score is start[CLS] + end[CLS], the minimum over the
question's windows. A question is answered when best span score - null score exceeds a
threshold, which is tuned on held-out data (the selection split), never on the reported one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertvision.evaluation.squad_metric import score_question


@dataclass
class Candidate:
    text: str  # best span's text ("" when no valid span exists)
    score_diff: float  # best span score - null score (-inf when no valid span exists)


def best_span(start_logits, end_logits, offsets: np.ndarray, n_best: int, max_answer_length: int):
    """(score, start, end) of the best valid span in one window, or None."""
    in_context = offsets[:, 0] >= 0
    if not in_context.any():
        return None
    s = np.where(in_context, start_logits, -np.inf)
    e = np.where(in_context, end_logits, -np.inf)
    k = min(n_best, int(in_context.sum()))
    top_s = np.argpartition(-s, k - 1)[:k]
    top_e = np.argpartition(-e, k - 1)[:k]
    # All (start, end) pairs of the top candidates, masked to valid spans.
    length = top_e[None, :] - top_s[:, None] + 1
    scores = s[top_s][:, None] + e[top_e][None, :]
    scores = np.where((length >= 1) & (length <= max_answer_length), scores, -np.inf)
    flat = int(np.argmax(scores))
    best = scores.flat[flat]
    if not np.isfinite(best):
        return None
    i, j = divmod(flat, len(top_e))
    return float(best), int(top_s[i]), int(top_e[j])


def decode_question(windows, context: str, n_best: int = 20, max_answer_length: int = 30) -> Candidate:
    """``windows``: iterable of (start_logits, end_logits, offsets (T, 2))."""
    best, best_text, null = -np.inf, "", np.inf
    for start_logits, end_logits, offsets in windows:
        null = min(null, float(start_logits[0] + end_logits[0]))
        found = best_span(start_logits, end_logits, offsets, n_best, max_answer_length)
        if found and found[0] > best:
            best = found[0]
            best_text = context[offsets[found[1], 0] : offsets[found[2], 1]]
    return Candidate(best_text, best - null)


def apply_threshold(candidates: list[Candidate], threshold: float) -> list[str]:
    return [c.text if c.score_diff > threshold else "" for c in candidates]


def tune_threshold(candidates: list[Candidate], gold_texts: list) -> float:
    """The null threshold that maximises total F1 on these (held-out) questions."""
    diffs = np.array([c.score_diff for c in candidates], dtype=np.float64)
    diffs = np.where(np.isfinite(diffs), diffs, -1e30)  # no valid span: never answered
    f1_answer = np.array([score_question(g, c.text)[1] for c, g in zip(candidates, gold_texts)])
    f1_null = np.array([score_question(g, "")[1] for g in gold_texts])
    order = np.argsort(-diffs, kind="stable")
    # Total F1 when answering the m questions with the largest diffs and abstaining on the rest.
    totals = f1_null.sum() + np.concatenate([[0.0], np.cumsum(f1_answer[order] - f1_null[order])])
    m = int(np.argmax(totals))
    ranked = diffs[order]
    if m == 0:
        return float(ranked[0])
    if m == len(ranked):
        return float(ranked[-1] - 1.0)
    return float((ranked[m - 1] + ranked[m]) / 2)
