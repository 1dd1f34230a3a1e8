"""Dynamic batching: concurrent requests wait in a queue; one worker takes requests until the
batch holds ``max_batch_size`` inputs (texts + questions) or ``max_wait_ms`` have passed since
the first arrived, runs the model once for all of them in a thread (so the event loop keeps
accepting requests meanwhile), and hands each request its own slice of the results.

While a batch runs, the next one fills up, so under load batches grow by themselves. A batch
that fails is retried request by request, so one bad request fails alone, with its error, and
the worker keeps running whatever happens. ``stop`` answers what is queued before it ends (a
graceful shutdown), up to ``drain_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bertvision.serving.items import QuestionItem, TextItem

log = logging.getLogger(__name__)

# engine.predict's signature: (texts, questions) -> (per-text results, per-question results)
RunBatch = Callable[[list[TextItem], list[QuestionItem]], tuple[list, list]]


class BatchFailed(RuntimeError):
    """The model raised on a request (not a problem with its shape: those are refused before)."""


class Overloaded(RuntimeError):
    """More requests are waiting than the queue holds."""


@dataclass
class QueuedRequest:
    """A request waiting for its batch: its items and the future its answers go to."""

    texts: list[TextItem]
    questions: list[QuestionItem]
    future: asyncio.Future

    @property
    def size(self) -> int:
        return len(self.texts) + len(self.questions)


@dataclass
class BatchStats:
    batches: int = 0  # model calls
    requests: int = 0  # requests answered (or failed)
    failed: int = 0
    largest: int = 0  # most requests in one batch

    def record(self, n_requests: int) -> None:
        self.batches += 1
        self.requests += n_requests
        self.largest = max(self.largest, n_requests)


class Batcher:
    def __init__(
        self,
        run: RunBatch,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queued: int = 1024,
        observer: Callable[[int, int, float], None] | None = None,
    ):
        """``observer(requests, inputs, seconds)`` is told of every model call that succeeded."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.run, self.max_batch_size, self.max_wait = run, max_batch_size, max(0.0, max_wait_ms) / 1000
        self.max_queued, self.observer = max_queued, observer
        self._busy = False  # a batch is being gathered or run: its requests are neither queued nor answered
        self.stats = BatchStats()
        self._queue: asyncio.Queue[QueuedRequest] | None = None
        self._held: QueuedRequest | None = None  # taken from the queue but left for the next batch (it did not fit)
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queued)
        self._worker = asyncio.create_task(self._loop(), name="bertvision-batcher")

    def queued(self) -> int:
        """Requests waiting for a batch."""
        return (self._queue.qsize() if self._queue is not None else 0) + (self._held is not None)

    async def stop(self, drain_seconds: float = 30.0) -> None:
        """Answer the queued requests (at most ``drain_seconds``), then end the worker."""
        deadline = time.monotonic() + drain_seconds
        while self._worker is not None and (self.queued() or self._busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None

    async def submit(self, texts: list[TextItem], questions: list[QuestionItem]) -> tuple[list, list]:
        """This request's (per-text results, per-question results), from a shared batch."""
        if self._queue is None:
            raise RuntimeError("the batcher is not running (start() it in the app's lifespan)")
        job = QueuedRequest(texts, questions, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise Overloaded(f"{self.max_queued} requests are already waiting; retry later") from None
        return await job.future

    async def _loop(self) -> None:
        while True:
            try:
                try:
                    await self._run(await self._collect())
                finally:
                    self._busy = False
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop the service
                log.exception("batch worker: unexpected error (continuing)")

    async def _collect(self) -> list[QueuedRequest]:
        first = self._held or await self._queue.get()
        self._held, self._busy = None, True
        jobs, size = [first], first.size
        deadline = time.monotonic() + self.max_wait
        while size < self.max_batch_size:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if size + job.size > self.max_batch_size:
                self._held = job
                break
            jobs.append(job)
            size += job.size
        return jobs

    async def _run(self, jobs: list[QueuedRequest]) -> None:
        jobs = [job for job in jobs if not job.future.done()]  # a client that went away
        if not jobs:
            return
        texts = [t for job in jobs for t in job.texts]
        questions = [q for job in jobs for q in job.questions]
        t0 = time.perf_counter()
        try:
            text_results, question_results = await asyncio.to_thread(self.run, texts, questions)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(BatchFailed("the service is shutting down"))
            raise
        except BaseException as err:  # tokenizers' Rust panics are BaseExceptions
            self.stats.batches += 1
            if len(jobs) > 1:
                log.warning(
                    "a batch of %d requests failed (%s: %s); retrying them one by one",
                    len(jobs),
                    type(err).__name__,
                    err,
                )
                for job in jobs:
                    await self._run([job])
                return
            log.error("a request failed: %s: %s", type(err).__name__, err, exc_info=err)
            self.stats.requests += 1
            self.stats.failed += 1
            if not jobs[0].future.done():
                jobs[0].future.set_exception(
                    BatchFailed(
                        f"the model failed on this request ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})"
                    )
                )
            return
        seconds = time.perf_counter() - t0
        self.stats.record(len(jobs))
        if self.observer is not None:
            self.observer(len(jobs), len(texts) + len(questions), seconds)
        t = q = 0
        for job in jobs:
            if not job.future.done():
                job.future.set_result(
                    (text_results[t : t + len(job.texts)], question_results[q : q + len(job.questions)])
                )
            t, q = t + len(job.texts), q + len(job.questions)
