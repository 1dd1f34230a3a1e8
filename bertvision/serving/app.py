"""The HTTP service (FastAPI): every task of a bundle answered from one encoder pass per batch.

- ``POST /predict``: ``{"texts": [...], "qa": [...], "tasks": [...], "heads": {...}}``; a text is a
  string (single-text tasks) or a pair ``[a, b]`` (pair tasks); a ``qa`` item is
  ``{"question", "context"}`` (span and answerability tasks). Answers per text per task (label,
  probabilities, score, raw outputs, the head used) and per question per question task (span:
  answer, has_answer; answerability: the label of its most confident window, as evaluated).
- ``GET /health`` (liveness), ``GET /ready`` (503 until the model is loaded and warmed),
  ``GET /tasks`` (tasks, default heads, every head's size and scores), ``GET /docs`` (OpenAPI).
- The Open Inference Protocol (KServe v2 REST) under ``/v2`` (``serving/v2.py``): every task a
  model.
- ``GET /metrics``: Prometheus metrics; one JSON access-log line per request
  (``serving/metrics.py``).

Shutting down (SIGTERM, SIGINT) stops taking connections, answers every request already queued,
then ends.

Bad input is always a 4xx JSON ``{"detail": "FIELD: what is wrong", "field": FIELD}`` (under
``/v2`` the protocol's ``{"error": ...}``) and is refused before it reaches the model; an
unexpected failure is a 5xx JSON; no request stops the server. A request whose client has gone
is dropped from its batch (``serving.client_gone``).
``create_app`` builds an app for one bundle; ``app_from_env`` is the factory ``bertvision serve``
hands to uvicorn (the bundle and settings come through environment variables, so that every
worker process builds its own).
"""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from bertvision.serving.batching import BatchFailed, Overloaded
from bertvision.serving.bundle import bundle_paths as bundle_paths_of
from bertvision.serving.client_gone import CLIENT_CLOSED, ClientGone, unless_client_gone
from bertvision.serving.docs_page import install_docs
from bertvision.serving.engine import Engine
from bertvision.serving.items import QuestionItem, RequestError, TextItem
from bertvision.serving.json_body import loads_keys_once, printable, unreadable_body
from bertvision.serving.metrics import Observed, ServiceMetrics
from bertvision.serving.requests import PredictRequest, PredictResponse, QAInput, build_items, request_examples
from bertvision.serving.server import BUNDLE_ENV, SETTINGS_ENV
from bertvision.serving.service import Service
from bertvision.serving.settings import ServeSettings
from bertvision.serving.v2 import READ, is_protocol_path, v2_router

log = logging.getLogger(__name__)


# A refused body is read to its end and dropped, up to this many times the limit (a few MB), so the
# connection stays usable; a longer one is left unread, which ends the connection, and the answer
# says so (else the client sends its next request on it and reads a reset).
DRAINED_LIMITS = 4
UNREAD_BODY = {"connection": "close"}


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
                return await error(400, "content-length", "not an integer", scope["path"])(scope, receive, send)
            if length > self.max_bytes:
                drained = await self.drained(receive, 0)
                return await self.too_large(length, scope["path"], drained)(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                drained = not more or await self.drained(receive, size)
                return await self.too_large(size, scope["path"], drained, at_least=True)(scope, receive, send)
            if not more:
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    async def drained(self, receive, read: int) -> bool:
        """Whether the rest of a refused body (``read`` bytes of it in) was read and dropped to its
        end within ``DRAINED_LIMITS`` times the limit."""
        while read <= DRAINED_LIMITS * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return False
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False

    def too_large(self, size: int, path: str, drained: bool, at_least: bool = False) -> JSONResponse:
        problem = f"{'more than ' if at_least else ''}{size} bytes, at most {self.max_bytes}"
        return error(413, "body", problem, path, None if drained else UNREAD_BODY)


def error(status: int, field: str | None, message: str, path: str = "", headers=None) -> JSONResponse:
    """An error answer in the form of the API ``path`` belongs to: the protocol's under ``/v2``."""
    field, message = (printable(field) if field else field), printable(message)
    text = f"{field}: {message}" if field else message
    key = "error" if is_protocol_path(path) else "detail"
    return JSONResponse({key: text, **({"field": field} if field else {})}, status_code=status, headers=headers)


def field_path(loc: tuple | list) -> str:
    """('body', 'qa', 1, 'question') -> 'qa[1].question'."""
    parts = list(loc[1:]) if loc and loc[0] == "body" else list(loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


NOT_AN_OBJECT = "a JSON object (content-type: application/json) with texts and/or qa"
JSON_KINDS = {str: "string", list: "list", int: "number", float: "number", bool: "boolean", type(None): "null"}


def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
    problems = []
    for e in err.errors():
        where = "body" if e.get("type") == "json_invalid" else field_path(e.get("loc", ()))
        message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == "json_invalid":  # where the parser stopped, as the v2 routes say it
            at = e["loc"][1] if len(e.get("loc", ())) > 1 else "?"
            message = f"not JSON ({e.get('ctx', {}).get('error', message)} at character {at})"
        if where == "body" and e.get("type") == "missing":  # no body at all
            message = f"empty; {NOT_AN_OBJECT}"
        if where == "body" and e.get("type") == "model_attributes_type":  # not JSON, or not sent as JSON
            given = e.get("input")  # the body's bytes where it was not sent as JSON, else what it parsed to
            if isinstance(given, bytes):
                what = f"a body sent as {request.headers.get('content-type') or 'no content-type'}"
            else:
                what = f"a JSON {JSON_KINDS.get(type(given), 'value')}"
            message = f"{NOT_AN_OBJECT}, not {what}"
        if e.get("type") == "extra_forbidden":  # the body's own keys, or a qa item's (qa[0].answer)
            model = QAInput if "qa" in e["loc"][1:2] else PredictRequest
            message = f"not a field here; it takes {', '.join(model.model_fields)}"
        problems.append({"field": printable(where), "message": printable(message)})
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems) or "invalid request"
    return JSONResponse(
        {"detail": detail, "field": problems[0]["field"] if problems else "body", "errors": problems}, status_code=422
    )


class KeysOnceRequest(Request):
    """A request whose JSON body gives each key of an object once (``loads_keys_once``)."""

    async def json(self):
        if not hasattr(self, "_json"):
            self._json = loads_keys_once(await self.body())
        return self._json


class KeysOnceRoute(APIRoute):
    """FastAPI's route reading its body through ``KeysOnceRequest``."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def keys_once(request: Request) -> Response:
            return await handler(KeysOnceRequest(request.scope, request.receive))

        return keys_once


def http_error(http: Request, err: HTTPException) -> Response:
    """Starlette's own refusals (no such path, a method a path does not take, a body it could not
    parse) in the form of the API the path belongs to."""
    if err.status_code == 400 and isinstance(err.__cause__, UnicodeDecodeError):
        undecodable = err.__cause__
        problem = f"not UTF-8 text (byte {undecodable.start + 1}: {undecodable.reason}); send the JSON in UTF-8"
        return error(400, "body", problem, http.url.path)
    if err.status_code == 400 and err.__cause__ is not None:  # FastAPI could not read the body's JSON
        return error(400, "body", f"{NOT_AN_OBJECT}; {unreadable_body(err.__cause__)}", http.url.path)
    if err.status_code == 400:
        return error(400, "body", f"{NOT_AN_OBJECT}; {str(err.detail).lower()}", http.url.path)
    if err.status_code == 405:  # it said "Method Not Allowed" alone
        allowed = sorted(m.strip() for m in (err.headers or {}).get("Allow", "").split(",") if m.strip())
        problem = f"{http.method} is not taken by {http.url.path}; it takes {', '.join(allowed) or 'no method'}"
        return error(405, "method", problem, http.url.path, err.headers)
    if err.status_code == 404 and err.detail == "Not Found":  # no route matched: it said "Not Found" alone
        where = "GET /v2/models lists the models" if is_protocol_path(http.url.path) else "GET /docs lists the routes"
        return error(404, "path", f"no route {http.url.path}; {where}", http.url.path, err.headers)
    return error(err.status_code, None, str(err.detail), http.url.path, err.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestError, lambda http, err: error(err.status, err.field, err.message, http.url.path))
    app.add_exception_handler(BatchFailed, lambda http, err: error(500, None, str(err), http.url.path))
    app.add_exception_handler(Overloaded, lambda http, err: error(503, None, str(err), http.url.path))
    app.add_exception_handler(ClientGone, lambda _, err: Response(status_code=CLIENT_CLOSED))

    def unexpected(http: Request, err: Exception) -> JSONResponse:
        log.error("unexpected error: %s: %s", type(err).__name__, err, exc_info=err)
        message = f"internal error ({type(err).__name__}); the service keeps running"
        return error(500, None, message, http.url.path)

    app.add_exception_handler(Exception, unexpected)


# --- the app -------------------------------------------------------------------------------------
def encoder_summary(engine: Engine) -> dict:
    bundle = engine.bundle
    return {
        "bundle": str(bundle.root),
        "keys": bundle.keys,
        "device": str(engine.device),
        "precision": bundle.precision,
        "layers": bundle.layers,
        "hidden": bundle.hidden,
        "tasks": list(bundle.tasks),
    }


def tasks_summary(service: Service) -> dict:
    """Every encoder (bundle) with its tasks, and every task with the encoder that answers it."""
    return {
        "encoders": [encoder_summary(e) for e in service.engines],
        "tasks": {
            name: {
                "encoder": service.owner[name],
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
            for name, t in service.tasks.items()
        },
    }


def create_app(
    bundle_paths: Path | str | list,
    settings: ServeSettings | None = None,
    engine: Engine | list[Engine] | None = None,
) -> FastAPI:
    """The service for the bundle(s) at ``bundle_paths`` (bundles, or sets of them; loaded now,
    so a broken bundle fails at startup; two bundles with a task in common are refused). ``engine``: already loaded ones
    (tests, benchmarks)."""
    settings = settings or ServeSettings()
    paths = bundle_paths_of(bundle_paths if isinstance(bundle_paths, (list, tuple)) else [bundle_paths])
    if engine is None:
        engines = [
            Engine(
                p,
                settings.device,
                settings.max_windows,
                settings.threads,
                settings.max_batch_tokens,
                settings.pad_multiple,
                settings.backend,
                settings.max_chunk_rows,
            )
            for p in paths
        ]
    else:
        engines = list(engine) if isinstance(engine, (list, tuple)) else [engine]
    service = Service(engines, settings)
    state = {"ready": False}

    def is_ready() -> bool:
        return state["ready"]

    metrics = ServiceMetrics(service, is_ready)
    for batcher in service.batchers:
        batcher.observer = metrics.observe_batch

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await service.start()
        await asyncio.gather(*(asyncio.to_thread(warm_up, e) for e in engines))
        state["ready"] = True
        try:
            yield
        finally:
            state["ready"] = False
            await service.stop()

    app = FastAPI(
        title="bertvision serve",
        lifespan=lifespan,
        docs_url=None,  # install_docs: the page's assets come from the service, not a CDN
        redoc_url=None,
        description=(
            "Every task of one or more bundles (an encoder and tiny heads per task each) answered from one "
            "encoder pass per batch and encoder."
        ),
    )
    app.state.service, app.state.settings, app.state.metrics = service, settings, metrics
    app.router.route_class = KeysOnceRoute  # the routes below, /predict's body
    v2 = v2_router(service, service.submit, settings, is_ready)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # the app's routes as they will be (a live list: the routes below are added after) and the
    # KServe v2 router's, whose templates the app's list does not show
    app.add_middleware(Observed, metrics=metrics, route_lists=(app.routes, v2.routes))
    install_error_handlers(app)
    install_docs(app)
    app.include_router(v2)

    @app.post(
        "/predict",
        response_model=PredictResponse,
        responses={
            413: {"description": "Body, inputs or a text too large"},
            422: {"description": "Invalid input; `detail` names the field"},
            503: {"description": "Too many requests waiting"},
        },
        openapi_extra={"requestBody": {"content": {"application/json": {"examples": request_examples(service)}}}},
    )
    async def predict(body: PredictRequest, http: Request) -> dict:
        """Answer every requested task for every input; see the request fields."""
        texts, questions = build_items(body, service, settings)
        text_results, question_results = await unless_client_gone(http, service.submit(texts, questions))
        return {
            "predictions": [{t: asdict(r) for t, r in per.items()} for per in text_results],
            "answers": [{t: asdict(r) for t, r in per.items()} for per in question_results],
        }

    @app.api_route("/health", methods=READ)
    async def health() -> dict:
        """Liveness, and how much batching happened: encoder passes vs model calls (every encoder
        together: a request that asks tasks of two encoders is a request to each)."""
        stats = [b.stats for b in service.batchers]
        return {
            "status": "ok",
            "bundles": [str(e.bundle.root) for e in engines],
            "device": str(engines[0].device),
            "pid": os.getpid(),
            "tasks": list(service.tasks),
            "encoder_passes": service.encoder_passes,
            "batches": sum(s.batches for s in stats),
            "requests": sum(s.requests for s in stats),
            "failed": sum(s.failed for s in stats),
            "largest_batch": max(s.largest for s in stats),
        }

    @app.api_route("/ready", methods=READ)
    async def ready():
        """Readiness: 200 once the model is loaded and warmed (one pass over every task), 503 before
        and while shutting down."""
        return {"ready": True} if is_ready() else JSONResponse({"ready": False}, status_code=503)

    @app.api_route("/metrics", methods=READ)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.api_route("/tasks", methods=READ)
    async def tasks() -> dict:
        """Every task: kind, text fields, labels, the default head and every head's parameters and scores."""
        return tasks_summary(service)

    return app


def warm_up(engine: Engine) -> None:
    """One pass over every task with its default head, so that the first request does not pay
    for lazy initialisation (and a model that cannot answer fails at startup)."""
    texts = [
        TextItem(("Warm up.",) * len(t.text_fields), {name: t.picked})
        for name, t in engine.tasks.items()
        if not t.takes_questions
    ]
    questions = [
        QuestionItem("What warms up?", "The service warms up.", {name: t.picked})
        for name, t in engine.tasks.items()
        if t.takes_questions
    ]
    engine.predict(texts, questions)


def app_from_env() -> FastAPI:
    """The app for uvicorn's factory mode: the bundles from $BERTVISION_SERVE_BUNDLE (joined by
    the path separator), settings
    (ServeSettings as JSON) from $BERTVISION_SERVE_SETTINGS."""
    if BUNDLE_ENV not in os.environ:
        raise RuntimeError(f"${BUNDLE_ENV} is not set (bertvision serve sets it)")
    settings = ServeSettings.from_json(os.environ[SETTINGS_ENV]) if os.environ.get(SETTINGS_ENV) else ServeSettings()
    return create_app([Path(p) for p in os.environ[BUNDLE_ENV].split(os.pathsep)], settings)
