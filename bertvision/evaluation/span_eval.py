"""Evaluation of span predictions (BERT's or a head's): per-window start/end logits ->
one answer per question -> SQuAD 2.0 metrics. The null threshold is tuned on the selection
split and applied unchanged to the evaluation splits."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from bertvision.data.tokenized import TokenizedSplit
from bertvision.evaluation.squad_decode import apply_threshold, decode_question, tune_threshold
from bertvision.evaluation.squad_metric import squad_v2_metrics
from bertvision.registry.task_spec import TaskSpec


def candidates(window_logits: list[np.ndarray], windows: TokenizedSplit, questions: pd.DataFrame, task: TaskSpec):
    """One decoding Candidate per question (row of ``questions``), in row order.
    ``window_logits[i]``: (T_i, 2) start/end logits of window i."""
    by_question = defaultdict(list)
    offsets = windows.offsets  # a property of the feature views: built once, not per window
    for i, q in enumerate(windows.idx):
        logits = window_logits[i]
        by_question[int(q)].append((logits[:, 0], logits[:, 1], offsets[i]))
    contexts = questions["context"].tolist()
    return [
        decode_question(by_question[row], contexts[row], task.span.n_best, task.span.max_answer_length)
        for row in range(len(questions))
    ]


def evaluate_span(task: TaskSpec, logits: dict, windows: dict, questions: dict) -> tuple[dict, pd.DataFrame]:
    """``logits``/``windows``/``questions``: split -> window logits / TokenizedSplit / raw frame,
    for the selection split and the evaluation splits. Returns metrics per split (plus the
    threshold, and ``constant_score``: what abstaining on every question scores on the primary
    metric, the mark of a model that learned nothing) and a predictions table."""
    cands = {split: candidates(logits[split], windows[split], questions[split], task) for split in logits}
    gold = {split: questions[split]["answer_texts"].tolist() for split in logits}
    threshold = tune_threshold(cands["selection"], gold["selection"])
    metrics, tables = {}, []
    for split in logits:
        preds = apply_threshold(cands[split], threshold)
        abstain = squad_v2_metrics(gold[split], [""] * len(gold[split]))[task.primary_metric]
        metrics[split] = {
            **squad_v2_metrics(gold[split], preds),
            "null_threshold": threshold,
            "constant_score": abstain,
        }
        tables.append(
            pd.DataFrame(
                {
                    "split": split,
                    "id": questions[split]["id"],
                    "prediction": preds,
                    "best_span": [c.text for c in cands[split]],
                    "score_diff": [c.score_diff for c in cands[split]],
                }
            )
        )
    return metrics, pd.concat(tables, ignore_index=True)


def best_selection_f1(task: TaskSpec, window_logits, windows: TokenizedSplit, questions: pd.DataFrame) -> dict:
    """Metrics on the selection split at its own best threshold (the criterion for choosing
    a head's epoch)."""
    cands = candidates(window_logits, windows, questions, task)
    gold = questions["answer_texts"].tolist()
    return squad_v2_metrics(gold, apply_threshold(cands, tune_threshold(cands, gold)))
