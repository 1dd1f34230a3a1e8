"""What a bundle may be asked, checked before a request joins a batch (so that a bad one is
answered with a 4xx naming its field and never reaches the encoder): the task and head it names,
a text's form, and a question and context the task's windows can hold."""

from __future__ import annotations

import math

from bertvision.serving.bundle import TaskEntry
from bertvision.serving.items import QuestionItem, RequestError, TextItem


class RequestChecks:
    """The checks of one bundle's requests; ``tokenizer``: an instance of the bundle's own that
    no batch uses (one fast tokenizer changing its truncation from two threads at once fails)."""

    def __init__(self, tasks: dict[str, TaskEntry], tokenizer, max_windows: int):
        self.tasks, self.tokenizer, self.max_windows = tasks, tokenizer, max_windows

    def task(self, name: str, field: str) -> TaskEntry:
        if name not in self.tasks:
            raise RequestError(field, f"unknown task {name!r}; this bundle serves {', '.join(self.tasks)}")
        return self.tasks[name]

    def head(self, task: TaskEntry, name: str | None, field: str) -> str:
        if name is None:
            return task.picked
        if name not in task.heads:
            raise RequestError(field, f"task {task.name} has no head {name!r}; its heads: {', '.join(task.heads)}")
        return name

    def text(self, item: TextItem, field: str) -> None:
        for name in item.heads:
            task = self.task(name, field)
            if task.takes_questions:
                raise RequestError(
                    field, f"{name} reads questions and contexts: send question/context items, not texts"
                )
            if len(task.text_fields) != len(item.texts):
                given = "a pair of texts" if len(item.texts) == 2 else "a single text"
                wanted = "a pair [a, b]" if len(task.text_fields) == 2 else "a single text"
                raise RequestError(field, f"task {name} takes {wanted} ({', '.join(task.text_fields)}), got {given}")

    def question(self, item: QuestionItem, field: str) -> None:
        """Question inputs (span and answerability tasks) the windows can hold: the question
        leaves the context more than doc_stride tokens per window, and the context needs at most
        ``max_windows`` windows."""
        tok = self.tokenizer
        q_len = len(tok(item.question.lstrip(), add_special_tokens=False)["input_ids"])
        c_len = len(tok(item.context, add_special_tokens=False)["input_ids"])
        for name in item.heads:
            task = self.task(name, field)
            if not task.takes_questions:
                raise RequestError(field, f"{name} takes texts, not question/context items: send its inputs as texts")
            budget = task.max_length - q_len - tok.num_special_tokens_to_add(pair=True)
            if budget <= task.doc_stride:
                most = task.max_length - tok.num_special_tokens_to_add(pair=True) - task.doc_stride - 1
                raise RequestError(
                    f"{field}.question",
                    f"too long for task {name}: {q_len} tokens, at most {most} "
                    f"(max_length {task.max_length}, doc_stride {task.doc_stride})",
                )
            windows = 1 if c_len <= budget else 1 + math.ceil((c_len - budget) / (budget - task.doc_stride))
            if windows > self.max_windows:
                raise RequestError(
                    f"{field}.context",
                    f"too long for task {name}: about {windows} windows of "
                    f"{task.max_length} tokens, at most {self.max_windows} per question",
                    status=413,
                )
