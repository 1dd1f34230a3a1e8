"""Several bundles behind one service: each bundle (one encoder and its tasks' heads) has its own
engine and batcher; a request is routed by task. The tasks of one bundle share one encoder pass
per batch; the parts of a request that go to different bundles run side by side (each batcher
runs its model in its own thread) and come back as one answer.

``Service`` answers what the request checks (``serving.requests``) ask of an engine (``tasks``,
``task``, ``head``, ``check_text``, ``check_question``), so that the checks and the HTTP layers
do not know how many encoders there are."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from bertvision.serving.batching import Batcher
from bertvision.serving.bundle import TaskEntry, task_owners
from bertvision.serving.engine import Engine
from bertvision.serving.items import QuestionItem, RequestError, TextItem
from bertvision.serving.settings import ServeSettings


class Service:
    def __init__(self, engines: list[Engine], settings: ServeSettings):
        if not engines:
            raise ValueError("a service needs at least one bundle")
        self.engines = engines
        self.batchers = [
            Batcher(e.predict, settings.max_batch_size, settings.max_wait_ms, settings.max_queued) for e in engines
        ]
        self.owner = task_owners([e.bundle for e in engines])
        self.tasks: dict[str, TaskEntry] = {n: engines[i].tasks[n] for n, i in self.owner.items()}

    # --- the checks' view of an engine -----------------------------------------------------------
    def engine_of(self, task: str) -> Engine:
        return self.engines[self.owner[task]]

    def task(self, name: str, field: str) -> TaskEntry:
        if name not in self.tasks:
            raise RequestError(field, f"unknown task {name!r}; this service serves {', '.join(self.tasks)}")
        return self.tasks[name]

    def head(self, task: TaskEntry, name: str | None, field: str) -> str:
        return self.engine_of(task.name).checks.head(task, name, field)

    def _parts(self, item) -> dict[int, object]:
        """``item`` cut by bundle: bundle index -> the item with that bundle's tasks only."""
        parts: dict[int, dict[str, str]] = {}
        for task, head in item.heads.items():
            if task not in self.owner:
                continue
            parts.setdefault(self.owner[task], {})[task] = head
        return {i: replace(item, heads=heads) for i, heads in parts.items()}

    def check_text(self, item: TextItem, field: str) -> None:
        for name in item.heads:
            self.task(name, field)
        for i, part in self._parts(item).items():
            self.engines[i].checks.text(part, field)

    def check_question(self, item: QuestionItem, field: str) -> None:
        for name in item.heads:
            self.task(name, field)
        for i, part in self._parts(item).items():
            self.engines[i].checks.question(part, field)

    # --- answering -------------------------------------------------------------------------------
    async def start(self) -> None:
        for batcher in self.batchers:
            await batcher.start()

    async def stop(self) -> None:
        await asyncio.gather(*(b.stop() for b in self.batchers))

    async def submit(self, texts: list[TextItem], questions: list[QuestionItem]) -> tuple[list, list]:
        """Per text and per question, task -> result, every bundle's part asked at once."""
        calls = {}
        for i in range(len(self.batchers)):
            t_parts = [self._parts(t).get(i) for t in texts]
            q_parts = [self._parts(q).get(i) for q in questions]
            if any(t_parts) or any(q_parts):
                calls[i] = (t_parts, q_parts)
        answers = await asyncio.gather(
            *(self.batchers[i].submit([t for t in ts if t], [q for q in qs if q]) for i, (ts, qs) in calls.items())
        )
        text_results = [{} for _ in texts]
        question_results = [{} for _ in questions]
        for (ts, qs), (t_answers, q_answers) in zip(calls.values(), answers):
            for out, parts, got in ((text_results, ts, t_answers), (question_results, qs, q_answers)):
                got = iter(got)
                for k, part in enumerate(parts):
                    if part:
                        out[k].update(next(got))
        return text_results, question_results

    # --- what the operations endpoints read --------------------------------------------------------
    @property
    def encoder_passes(self) -> int:
        return sum(e.encoder_passes for e in self.engines)

    def failed(self) -> int:
        return sum(b.stats.failed for b in self.batchers)

    def queued(self) -> int:
        return sum(b.queued() for b in self.batchers)
