"""From a batch's outputs to answers, read as the evaluation reads them: a label, probabilities
or a score per example; a span decoded over a question's windows and cut at the head's null
threshold; answerability from the question's most confident window; and, for a head + BERT
ensemble, the head's outputs combined with the task model's own first."""

from __future__ import annotations

import numpy as np
import torch

from bertvision.evaluation.ensemble import ensemble_examples, ensemble_windows
from bertvision.evaluation.squad_decode import apply_threshold, decode_question
from bertvision.registry.metrics import best_window, predictions_from_outputs
from bertvision.serving.bundle import TaskEntry
from bertvision.serving.items import ExampleResult, SpanResult, finite


def example_result(task: TaskEntry, head: str, outputs: np.ndarray) -> ExampleResult:
    values = [finite(v) for v in outputs]
    if task.kind == "regression":
        return ExampleResult(head, values, score=finite(predictions_from_outputs(outputs[None], task.kind)[0]))
    label_id = int(predictions_from_outputs(outputs[None], task.kind)[0])
    shifted = np.exp(outputs.astype(np.float64) - np.max(outputs))
    probabilities = shifted / shifted.sum()
    return ExampleResult(
        head,
        values,
        label=task.label_names[label_id],
        label_id=label_id,
        probabilities={name: finite(p) for name, p in zip(task.label_names, probabilities)},
    )


def bert_outputs(out, rows: np.ndarray, lengths: np.ndarray) -> dict[int, np.ndarray]:
    """The task model's own outputs per row of a forward pass, as its evaluation stored them:
    logits per example, or a span window's (tokens, 2) start/end logits over its real tokens."""
    if getattr(out, "start_logits", None) is not None:  # ONNX Runtime's answer carries both names
        both = torch.stack([out.start_logits, out.end_logits], dim=-1).float().cpu().numpy()
        return {int(row): both[j, : lengths[row]] for j, row in enumerate(rows)}
    logits = out.logits.float().cpu().numpy()
    return {int(row): logits[j] for j, row in enumerate(rows)}


def with_bert(task: TaskEntry, how: str, outputs: list[np.ndarray], bert: list[np.ndarray]) -> list[np.ndarray]:
    """A head + BERT ensemble's outputs, per example or window, as the evaluation combines them:
    span windows' start and end distributions over their tokens, otherwise over the outputs."""
    if task.is_span:
        return ensemble_windows(list(outputs), list(bert), how)
    return list(ensemble_examples(np.stack(outputs), np.stack(bert), how, task.kind))


def span_answer(task: TaskEntry, head: str, context: str, spans: list) -> SpanResult:
    """A question's answer from its windows' (start logits, end logits, offsets)."""
    best = decode_question(spans, context, task.n_best, task.max_answer_length)
    threshold = task.heads[head].null_threshold
    return SpanResult(
        head,
        apply_threshold([best], threshold)[0],
        bool(best.score_diff > threshold),
        best.text,
        finite(best.score_diff),
        threshold,
    )


def answerability(task: TaskEntry, head: str, outputs: list[np.ndarray]) -> ExampleResult:
    """A question's label by the evaluation's rule (``best_window``: answerable when its most
    confident window says so), with that window's outputs and probabilities."""
    stacked = np.stack(outputs)
    label_id = int(best_window(stacked, np.zeros(len(stacked), dtype=np.int64))[0])
    chosen = stacked[int(np.argmax(stacked[:, 0] - stacked[:, 1]))]
    result = example_result(task, head, chosen)
    result.label_id, result.label = label_id, task.label_names[label_id]
    return result
