"""The HTTP service (FastAPI): every task of a bundle answered from one encoder pass per batch.

- ``POST /predict``: ``{"texts": [...], "qa": [...], "tasks": [...], "heads": {...}}``; a text is a
  string (single-text tasks) or a pair ``[a, b]`` (pair tasks); a ``qa`` item is
  ``{"question", "context"}`` (span tasks). Answers per text per task (label, probabilities,
  score, raw outputs, the head used) and per question per span task (answer, has_answer).
- ``GET /health``, ``GET /tasks`` (tasks, default heads, every head's size and scores),
  ``GET /docs`` (OpenAPI).

Bad input is always a 4xx JSON ``{"detail": "FIELD: what is wrong", ...}`` and is refused before
it reaches the model; an unexpected failure is a 5xx JSON; no request stops the server.
``create_app`` builds an app for one bundle; ``app_from_env`` is the factory ``bertvision serve``
hands to uvicorn (the bundle and settings come through environment variables, so that every
worker process builds its own).
"""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from bertvision.serving.batching import Batcher, BatchFailed, Overloaded
from bertvision.serving.engine import Engine, QuestionItem, RequestError, TextItem
from bertvision.serving.settings import ServeSettings

log = logging.getLogger(__name__)

BUNDLE_ENV = "BERTVISION_SERVE_BUNDLE"
SETTINGS_ENV = "BERTVISION_SERVE_SETTINGS"


# --- request and response bodies ---------------------------------------------------------------
def _text_input(value: Any) -> str | tuple[str, str]:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return (value[0], value[1])
    raise ValueError("a text is a string, or a pair [a, b] of two strings for pair tasks")


TextInput = Annotated[str | tuple[str, str], PlainValidator(_text_input, json_schema_input_type=str | tuple[str, str])]


class QAInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(description="The question.")
    context: str = Field(description="The passage the answer is taken from (long ones span several windows).")


class PredictRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"texts": [["The cat sat.", "A cat was sitting."]], "tasks": ["mrpc", "stsb"]},
                {"qa": [{"question": "Who sat?", "context": "The cat sat on the mat."}]},
            ]
        },
    )
    texts: list[TextInput] | None = Field(
        None,
        description=(
            "Inputs of the classification and regression tasks: each a string (single-text tasks such as sst2) or "
            "a pair [a, b] (pair tasks such as mrpc, stsb). Each is tokenized once and encoded once for all tasks."
        ),
    )
    qa: list[QAInput] | None = Field(None, description="Inputs of the span (question answering) tasks such as squad2.")
    tasks: list[str] | None = Field(
        None,
        description=(
            "Tasks to answer (GET /tasks lists them). Default: for each text, every example task that takes its "
            "number of texts; for qa items, every span task."
        ),
    )
    heads: dict[str, str] | None = Field(
        None, description=("task -> head to use instead of the task's default head (the best on the selection split).")
    )


class ExampleAnswer(BaseModel):
    head: str = Field(description="The head that answered.")
    label: str | None = Field(None, description="Classification: the predicted label's name.")
    label_id: int | None = None
    probabilities: dict[str, float | None] | None = Field(None, description="Classification: softmax per label.")
    score: float | None = Field(None, description="Regression: the predicted value.")
    outputs: list[float | None] = Field(description="The head's raw outputs (logits, or the regression value).")


class SpanAnswer(BaseModel):
    head: str
    answer: str = Field(description='The answer, "" when the question is judged unanswerable.')
    has_answer: bool
    best_span: str = Field(description="The best span, whatever the null threshold says.")
    score_diff: float | None = Field(description="Best span score - null score (null: no valid span).")
    null_threshold: float = Field(description="Answered when score_diff exceeds it (tuned on the selection split).")


class PredictResponse(BaseModel):
    predictions: list[dict[str, ExampleAnswer]] = Field(description="Per text (in order): task -> answer.")
    answers: list[dict[str, SpanAnswer]] = Field(description="Per qa item (in order): span task -> answer.")


# --- checking a request --------------------------------------------------------------------------
def check_not_empty(body: PredictRequest) -> None:
    if body.texts is not None and not body.texts:
        raise RequestError("texts", "empty list; give at least one text (or leave it out and give qa)")
    if body.qa is not None and not body.qa:
        raise RequestError("qa", "empty list; give at least one question/context item (or leave it out)")


def strings(body: PredictRequest):
    """(field, string) of every text, question and context of the request."""
    for i, text in enumerate(body.texts or []):
        if isinstance(text, str):
            yield f"texts[{i}]", text
        else:
            yield from ((f"texts[{i}][{k}]", part) for k, part in enumerate(text))
    for i, item in enumerate(body.qa or []):
        yield f"qa[{i}].question", item.question
        yield f"qa[{i}].context", item.context


def check_sizes(body: PredictRequest, settings: ServeSettings) -> None:
    texts, qa = body.texts, body.qa
    if not texts and not qa:
        raise RequestError("texts", "no inputs: give texts (classification / regression) or qa (span tasks)")
    n = len(texts or []) + len(qa or [])
    if n > settings.max_texts_per_request:
        raise RequestError(
            "texts" if texts else "qa", f"{n} inputs, at most {settings.max_texts_per_request} per request", status=413
        )
    for field, text in strings(body):
        if len(text) > settings.max_text_chars:
            raise RequestError(field, f"{len(text)} characters, at most {settings.max_text_chars}", status=413)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON may carry lone surrogates ("\ud800"); the tokenizer cannot read them
            raise RequestError(field, "not valid Unicode (a lone surrogate)") from None


def chosen_tasks(body: PredictRequest, engine: Engine) -> tuple[list[str] | None, list[str]]:
    """(example tasks asked by name, or None for each text's default; span tasks)."""
    if body.tasks is None:
        return None, ([n for n, t in engine.tasks.items() if t.is_span] if body.qa else [])
    if not body.tasks:
        raise RequestError("tasks", "empty list; leave it out to answer every task that fits the inputs")
    names = list(dict.fromkeys(body.tasks))
    for i, name in enumerate(body.tasks):
        engine.task(name, f"tasks[{i}]")
    example = [n for n in names if not engine.tasks[n].is_span]
    span = [n for n in names if engine.tasks[n].is_span]
    if example and not body.texts:
        raise RequestError("texts", f"tasks {', '.join(example)} need texts")
    if span and not body.qa:
        raise RequestError(
            "qa",
            f"{', '.join(span)} {'is a span task' if len(span) == 1 else 'are span tasks'}: "
            "give question/context items in qa",
        )
    if body.texts and not example:
        raise RequestError("texts", f"none of the tasks asked ({', '.join(names)}) takes texts (span tasks take qa)")
    if body.qa and not span:
        raise RequestError("qa", f"none of the tasks asked ({', '.join(names)}) is a span task")
    return example, span


def head_choices(body: PredictRequest, engine: Engine, asked: set[str] | None) -> dict[str, str]:
    """task -> head for every task the request names in ``heads`` (checked)."""
    chosen = {}
    for name, head in (body.heads or {}).items():
        task = engine.task(name, f"heads.{name}")
        if asked is not None and name not in asked:
            raise RequestError(
                f"heads.{name}", f"task {name} is not among the tasks asked ({', '.join(sorted(asked))})"
            )
        chosen[name] = engine.head(task, head, f"heads.{name}")
    return chosen


def default_tasks(engine: Engine, arity: int, field: str) -> list[str]:
    names = [n for n, t in engine.tasks.items() if not t.is_span and len(t.text_fields) == arity]
    if not names:
        kind = "a pair of texts" if arity == 2 else "a single text"
        raise RequestError(
            field,
            f"no task of this bundle takes {kind}; its example tasks take "
            + ", ".join(f"{n} ({len(t.text_fields)} text(s))" for n, t in engine.tasks.items() if not t.is_span),
        )
    return names


def build_items(
    body: PredictRequest, engine: Engine, settings: ServeSettings
) -> tuple[list[TextItem], list[QuestionItem]]:
    """The request as engine inputs, every check done (RequestError names the field at fault)."""
    check_not_empty(body)
    example, span = chosen_tasks(body, engine)
    check_sizes(body, settings)
    asked = None if example is None and body.texts else set((example or []) + span)
    heads = head_choices(body, engine, asked)
    texts = []
    for i, text in enumerate(body.texts or []):
        parts = (text,) if isinstance(text, str) else tuple(text)
        names = example if example is not None else default_tasks(engine, len(parts), f"texts[{i}]")
        item = TextItem(parts, {n: heads.get(n, engine.tasks[n].picked) for n in names})
        engine.check_text(item, f"texts[{i}]")
        texts.append(item)
    questions = []
    for i, qa in enumerate(body.qa or []):
        item = QuestionItem(qa.question, qa.context, {n: heads.get(n, engine.tasks[n].picked) for n in span})
        engine.check_question(item, f"qa[{i}]")
        questions.append(item)
    return texts, questions


# --- limits and errors ---------------------------------------------------------------------------
class BodyLimit:
    """Refuses (413) a body over ``max_bytes``: by its Content-Length, and by the bytes that
    actually arrive (chunked bodies, or a header that lies). The body is read here and replayed."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                return await error(400, "content-length", "not an integer")(scope, receive, send)
            if length > self.max_bytes:
                return await self.too_large(length)(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self.too_large(size, at_least=True)(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    def too_large(self, size: int, at_least: bool = False) -> JSONResponse:
        return error(413, "body", f"{'more than ' if at_least else ''}{size} bytes, at most {self.max_bytes}")


def error(status: int, field: str, message: str, **extra) -> JSONResponse:
    return JSONResponse({"detail": f"{field}: {message}", "field": field, **extra}, status_code=status)


def field_path(loc: tuple | list) -> str:
    """('body', 'qa', 1, 'question') -> 'qa[1].question'."""
    parts = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    problems = []
    for e in err.errors():
        where = "body" if e.get("type") == "json_invalid" else field_path(e.get("loc", ()))
        message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append({"field": where, "message": message})
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems) or "invalid request"
    return JSONResponse(
        {"detail": detail, "field": problems[0]["field"] if problems else "body", "errors": problems}, status_code=422
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(RequestError, lambda _, err: error(err.status, err.field, err.message))
    app.add_exception_handler(BatchFailed, lambda _, err: JSONResponse({"detail": str(err)}, status_code=500))
    app.add_exception_handler(Overloaded, lambda _, err: JSONResponse({"detail": str(err)}, status_code=503))

    def unexpected(_: Request, err: Exception) -> JSONResponse:
        log.error("unexpected error: %s: %s", type(err).__name__, err, exc_info=err)
        return JSONResponse(
            {"detail": f"internal error ({type(err).__name__}); the service keeps running"}, status_code=500
        )

    app.add_exception_handler(Exception, unexpected)


# --- the app -------------------------------------------------------------------------------------
def tasks_summary(engine: Engine) -> dict:
    bundle = engine.bundle
    return {
        "keys": bundle.keys,
        "precision": bundle.precision,
        "layers": bundle.layers,
        "hidden": bundle.hidden,
        "tasks": {
            name: {
                "kind": t.kind,
                "text_fields": list(t.text_fields),
                "label_names": list(t.label_names),
                "primary_metric": t.primary_metric,
                "max_length": t.max_length,
                "doc_stride": t.doc_stride,
                "feature_level": t.feature_level,
                "picked": t.picked,
                "heads": {h: e.summary() for h, e in t.heads.items()},
            }
            for name, t in bundle.tasks.items()
        },
    }


def create_app(bundle_path: Path | str, settings: ServeSettings | None = None, engine: Engine | None = None) -> FastAPI:
    """The service for the bundle at ``bundle_path`` (loaded now, so a broken bundle fails at
    startup). ``engine``: an already loaded one (tests, benchmarks)."""
    settings = settings or ServeSettings()
    engine = engine or Engine(
        Path(bundle_path), settings.device, settings.max_windows, settings.threads, settings.max_batch_tokens
    )
    batcher = Batcher(engine.predict, settings.max_batch_size, settings.max_wait_ms, settings.max_queued)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(
        title="bertvision serve",
        lifespan=lifespan,
        description=(
            "Every task of a bundle (one encoder, tiny heads per task) answered from one encoder pass per batch."
        ),
    )
    app.state.engine, app.state.batcher, app.state.settings = engine, batcher, settings
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)

    @app.post(
        "/predict",
        response_model=PredictResponse,
        responses={
            413: {"description": "Body, inputs or a text too large"},
            422: {"description": "Invalid input; `detail` names the field"},
            503: {"description": "Too many requests waiting"},
        },
    )
    async def predict(body: PredictRequest) -> dict:
        """Answer every requested task for every input; see the request fields."""
        texts, questions = build_items(body, engine, settings)
        text_results, question_results = await batcher.submit(texts, questions)
        return {
            "predictions": [{t: asdict(r) for t, r in per.items()} for per in text_results],
            "answers": [{t: asdict(r) for t, r in per.items()} for per in question_results],
        }

    @app.get("/health")
    async def health() -> dict:
        """Liveness, and how much batching happened: encoder passes vs requests."""
        stats = batcher.stats
        return {
            "status": "ok",
            "bundle": str(engine.bundle.root),
            "device": str(engine.device),
            "pid": os.getpid(),
            "tasks": list(engine.tasks),
            "encoder_passes": engine.encoder_passes,
            "batches": stats.batches,
            "requests": stats.requests,
            "failed": stats.failed,
            "largest_batch": stats.largest,
        }

    @app.get("/tasks")
    async def tasks() -> dict:
        """Every task: kind, text fields, labels, the default head and every head's parameters and scores."""
        return tasks_summary(engine)

    return app


def app_from_env() -> FastAPI:
    """The app for uvicorn's factory mode: the bundle from $BERTVISION_SERVE_BUNDLE, settings
    (ServeSettings as JSON) from $BERTVISION_SERVE_SETTINGS."""
    if BUNDLE_ENV not in os.environ:
        raise RuntimeError(f"${BUNDLE_ENV} is not set (bertvision serve sets it)")
    settings = ServeSettings.from_json(os.environ[SETTINGS_ENV]) if os.environ.get(SETTINGS_ENV) else ServeSettings()
    return create_app(Path(os.environ[BUNDLE_ENV]), settings)
