"""The Open Inference Protocol (KServe v2, REST) beside the service's own API: each task of the
bundle is a model. Written as FastAPI routes over the same service and batchers rather than on the
``kserve`` model server: that server runs one model per predictor call, so the tasks of a batch
would no longer share one encoder pass, and it would bring a second HTTP stack to configure.

- ``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready`` (503 until the model
  is loaded and warmed), ``/v2/models`` (every task), ``/v2/models/{task}`` (its tensors),
  ``/v2/models/{task}/ready``.
- ``POST /v2/models/{task}/infer``: BYTES tensors ``text`` (single-text tasks), ``text_a`` and
  ``text_b`` (pair tasks), ``question`` and ``context`` (span and answerability tasks), shape ``[n]`` or
  ``[n, 1]``, as JSON ``data`` or in the binary tensor extension (what ``tritonclient`` sends by
  default). The request's ``parameters.head`` picks a head (default: the task's picked head).
  Outputs as named tensors, in JSON: ``label`` (BYTES), ``label_id`` (INT64), ``probabilities``
  and ``logits`` (FP32, [n, labels]) for classification; ``score`` (FP32) for regression;
  ``answer`` (BYTES), ``has_answer`` (BOOL), ``score_diff`` (FP32, NaN where no span is valid)
  for span tasks; answerability answers as classification, from each question's best window.
  ``outputs`` in the request limits them to those named; they come as JSON ``data`` even where
  an output asks for ``binary_data`` (the protocol's clients read either).

Errors: ``{"error": "FIELD: what is wrong", "field": FIELD}`` with a 4xx (400 bad input, 404
unknown model or path, 405 a method a path does not take, 413 too large, 503 overloaded), fields
named as the protocol names them (``inputs.text_b[3]``); every answer under ``/v2`` that is not a
success has this form, a 5xx too."""

from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from bertvision import __version__
from bertvision.serving.batching import Overloaded
from bertvision.serving.bundle import TaskEntry
from bertvision.serving.client_gone import unless_client_gone
from bertvision.serving.items import RequestError
from bertvision.serving.json_body import loads_keys_once, printable, unreadable_body
from bertvision.serving.requests import PredictRequest, QAInput, build_items
from bertvision.serving.service import Service
from bertvision.serving.settings import ServeSettings

PREFIX = "/v2"
HEADER_LENGTH = "inference-header-content-length"  # the binary tensor extension's header


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    per_item: tuple[int, ...] = ()  # the shape of one item's part (-1: the batch axis comes first)


def input_tensors(task: TaskEntry) -> list[Tensor]:
    if task.takes_questions:
        return [Tensor("question", "BYTES"), Tensor("context", "BYTES")]
    return (
        [Tensor("text", "BYTES")]
        if len(task.text_fields) == 1
        else [Tensor("text_a", "BYTES"), Tensor("text_b", "BYTES")]
    )


def output_tensors(task: TaskEntry) -> list[Tensor]:
    if task.is_span:
        return [Tensor("answer", "BYTES"), Tensor("has_answer", "BOOL"), Tensor("score_diff", "FP32")]
    if task.kind == "regression":
        return [Tensor("score", "FP32")]
    labels = (len(task.label_names),)
    return [
        Tensor("label", "BYTES"),
        Tensor("label_id", "INT64"),
        Tensor("probabilities", "FP32", labels),
        Tensor("logits", "FP32", labels),
    ]


def tensor_metadata(tensors: list[Tensor]) -> list[dict]:
    return [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.per_item]} for t in tensors]


class ProtocolError(RequestError):
    """A request the protocol layer refuses (status 400 unless said)."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(field, message, status)


def v2_error(err: RequestError) -> JSONResponse:
    status = 400 if err.status == 422 else err.status
    field = printable(err.field)
    return JSONResponse({"error": f"{field}: {printable(err.message)}", "field": field}, status_code=status)


def is_protocol_path(path: str) -> bool:
    return path == PREFIX or path.startswith(f"{PREFIX}/")


# --- reading a request ---------------------------------------------------------------------------
def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """(JSON header, binary tail) of an infer request."""
    if header_length is None:
        json_part, tail = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError("Inference-Header-Content-Length", "not an integer") from None
        if not 0 < n <= len(body):
            raise ProtocolError("Inference-Header-Content-Length", f"{n}, but the body has {len(body)} bytes")
        json_part, tail = body[:n], body[n:]
    try:
        request = loads_keys_once(json_part)
    except (ValueError, RecursionError) as err:  # ValueError: not JSON, or not UTF-8 text, or a key twice
        raise ProtocolError("body", unreadable_body(err)) from None
    if not isinstance(request, dict):
        raise ProtocolError("body", "the request is a JSON object with `inputs`")
    return request, tail


def _elements(data, shape: list[int], field: str) -> list:
    """A tensor's elements: ``data`` flat in row-major order, or nested as ``shape`` is ([n, 1]:
    ``[["a"], ["b"]]``), never deeper."""
    if not isinstance(data, list):
        return [data]
    rows = [isinstance(row, list) for row in data]
    if not any(rows):
        return data
    if not all(rows) or len(shape) != 2 or len(data) != shape[0]:
        raise ProtocolError(f"{field}.data", f"nested unlike the shape {shape}: give it flat, or nested as the shape")
    if any(len(row) != shape[1] or any(isinstance(x, list) for x in row) for row in data):
        raise ProtocolError(f"{field}.data", f"a row that is not {shape[1]} element(s) of the shape {shape}")
    return [x for row in data for x in row]


def _object(value, field: str) -> dict:
    """An optional ``parameters`` object (absent or null: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(field, f"an object of named parameters, not {type(value).__name__}")
    return value


def _binary_strings(chunk: bytes, field: str) -> list[str]:
    """BYTES elements of the binary extension: each a 4-byte little-endian length, then the bytes."""
    out, at = [], 0
    while at < len(chunk):
        if at + 4 > len(chunk):
            raise ProtocolError(field, "binary BYTES data ends inside an element's length")
        (n,) = struct.unpack_from("<I", chunk, at)
        at += 4
        if at + n > len(chunk):
            raise ProtocolError(field, f"binary BYTES element of {n} bytes runs past the data")
        out.append(_text(chunk[at : at + n], field))
        at += n
    return out


def _text(value, field: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(field, "not UTF-8 text") from None
    if not isinstance(value, str):
        raise ProtocolError(field, f"BYTES elements are strings, got {type(value).__name__}")
    return value


def read_inputs(request: dict, tail: bytes, task: TaskEntry) -> dict[str, list[str]]:
    """Every input tensor of ``task``, as its list of strings (checked: names, datatypes, shapes,
    one count for all)."""
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("inputs", "a non-empty list of input tensors is required")
    wanted = {t.name: t for t in input_tensors(task)}
    found: dict[str, list[str]] = {}
    at = 0
    for i, tensor in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise ProtocolError(where, "an input tensor is an object with name, shape, datatype, data")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f"{where}.name", f"a tensor's name (a string), not {name!r}")
        if name not in wanted:
            raise ProtocolError(
                f"{where}.name", f"{name!r} is not an input of {task.name}; it takes {', '.join(wanted)}"
            )
        if name in found:
            raise ProtocolError(f"{where}.name", f"{name!r} given twice")
        if tensor.get("datatype") != wanted[name].datatype:
            raise ProtocolError(f"inputs.{name}.datatype", f"{tensor.get('datatype')!r}; {name} is BYTES")
        shape = tensor.get("shape")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape) and 1 <= len(shape) <= 2):
            raise ProtocolError(f"inputs.{name}.shape", f"{shape!r}; expected [n] or [n, 1]")
        if len(shape) == 2 and shape[1] != 1:
            raise ProtocolError(f"inputs.{name}.shape", f"{shape}: one string per item, [n] or [n, 1]")
        size = _object(tensor.get("parameters"), f"inputs.{name}.parameters").get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0:
                raise ProtocolError(f"inputs.{name}.parameters.binary_data_size", f"{size!r}; a count of bytes")
            if at + size > len(tail):
                raise ProtocolError(f"inputs.{name}.parameters.binary_data_size", f"{size!r} runs past the body")
            values = _binary_strings(tail[at : at + size], f"inputs.{name}")
            at += size
        elif "data" in tensor:
            values = [_text(v, f"inputs.{name}") for v in _elements(tensor["data"], shape, f"inputs.{name}")]
        else:
            raise ProtocolError(f"inputs.{name}.data", "missing (give data, or binary_data_size with a binary body)")
        if len(values) != math.prod(shape):
            raise ProtocolError(
                f"inputs.{name}.shape", f"{shape} holds {math.prod(shape)} items, data has {len(values)}"
            )
        found[name] = values
    if at != len(tail):  # bytes no tensor declares: a size given wrong, not data to pass over
        raise ProtocolError(
            "inputs", f"the binary tensors declare {at} bytes; the body holds {len(tail)} after the JSON"
        )
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ProtocolError("inputs", f"{task.name} needs {', '.join(wanted)}; missing {', '.join(missing)}")
    counts = {len(v) for v in found.values()}
    if len(counts) > 1:
        sizes = ", ".join(f"{n} {len(found[n])}" for n in wanted)
        problem = f"the inputs hold different numbers of items ({sizes}); give one per example in each"
        raise ProtocolError("inputs", problem)
    if counts == {0}:
        raise ProtocolError("inputs", "no items")
    return found


def as_predict_request(task: TaskEntry, values: dict[str, list[str]], head: str | None) -> PredictRequest:
    heads = {task.name: head} if head is not None else None
    if task.takes_questions:
        qa = [QAInput(question=q, context=c) for q, c in zip(values["question"], values["context"])]
        return PredictRequest(qa=qa, tasks=[task.name], heads=heads)
    texts = values["text"] if "text" in values else [[a, b] for a, b in zip(values["text_a"], values["text_b"])]
    return PredictRequest(texts=texts, tasks=[task.name], heads=heads)


_NATIVE_FIELD = re.compile(r"^(texts|qa)\[(\d+)\](?:\[(\d)\]|\.(question|context))?(.*)$")


def protocol_field(field: str, task: TaskEntry) -> str:
    """The native API's field (``texts[3][1]``, ``qa[0].context``) as the protocol names it."""
    m = _NATIVE_FIELD.match(field)
    if m is None:
        if field in ("texts", "qa"):  # the request as a whole (its count of items)
            return "inputs"
        return "parameters.head" if field.startswith("heads.") else field
    kind, item, part, qa_part, rest = m.groups()
    if kind == "qa":
        name = qa_part or "question"
    elif len(task.text_fields) == 1:
        name = "text"
    else:
        name = ("text_a", "text_b")[int(part or 0)]
    return f"inputs.{name}[{item}]{rest}"


# --- writing the answer --------------------------------------------------------------------------
def output_data(task: TaskEntry, results: list) -> dict[str, list]:
    if task.is_span:
        return {
            "answer": [r.answer for r in results],
            "has_answer": [r.has_answer for r in results],
            "score_diff": [r.score_diff if r.score_diff is not None else math.nan for r in results],
        }
    if task.kind == "regression":
        return {"score": [r.score for r in results]}
    return {
        "label": [r.label for r in results],
        "label_id": [r.label_id for r in results],
        "probabilities": [[r.probabilities[name] for name in task.label_names] for r in results],
        "logits": [list(r.outputs) for r in results],
    }


def _json_number(x):
    """JSON has no NaN or infinity: send them as null (a client reads null FP32 as NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return [_json_number(v) for v in x] if isinstance(x, list) else x


def asked_outputs(task: TaskEntry, request: dict) -> list[str]:
    """The names of the outputs the request asks for (checked before the model runs), or all."""
    tensors = [t.name for t in output_tensors(task)]
    asked = request.get("outputs")
    if asked is None:
        return tensors
    if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
        raise ProtocolError("outputs", "a list of {name} objects")
    names = []
    for i, output in enumerate(asked):
        name = output.get("name")
        if not isinstance(name, str) or name not in tensors:
            raise ProtocolError(
                f"outputs[{i}].name", f"{name!r} is not an output of {task.name}; it gives {', '.join(tensors)}"
            )
        if name in names:
            raise ProtocolError(f"outputs[{i}].name", f"{name!r} asked twice")
        _object(output.get("parameters"), f"outputs[{i}].parameters")
        names.append(name)
    return names


def infer_response(task: TaskEntry, request: dict, names: list[str], results: list) -> dict:
    data = output_data(task, results)
    tensors = {t.name: t for t in output_tensors(task)}
    outputs = [
        {
            "name": name,
            "datatype": tensors[name].datatype,
            "shape": [len(results), *tensors[name].per_item],
            "data": _json_number([v for row in data[name] for v in (row if isinstance(row, list) else [row])]),
        }
        for name in names
    ]
    response = {"model_name": task.name, "model_version": MODEL_VERSION, "outputs": outputs}
    if "id" in request:
        response["id"] = request["id"]
    return response


# --- the routes ----------------------------------------------------------------------------------
# Each task is one model of one version: a run's picked head is the model, and a new run is a new service.
MODEL_VERSION = "1"


# a route that reads answers HEAD as GET, without the body: load balancers check health with it
READ = ["GET", "HEAD"]


def v2_router(service: Service, submit, settings: ServeSettings, is_ready) -> APIRouter:
    """The protocol's routes. ``submit``: the batcher's; ``is_ready()``: loaded and warmed."""
    router = APIRouter(prefix=PREFIX, tags=["Open Inference Protocol (KServe v2)"])

    def model(name: str, version: str | None = None) -> TaskEntry:
        """The task a path names; its version, when the path gives one, must be the one it has."""
        if name not in service.tasks:
            raise ProtocolError(
                "model_name", f"unknown model {name!r}; this service serves {', '.join(service.tasks)}", 404
            )
        if version is not None and version != MODEL_VERSION:
            raise ProtocolError(
                "model_version", f"model {name!r} has version {MODEL_VERSION} only, not {version!r}", 404
            )
        return service.tasks[name]

    def model_metadata(task: TaskEntry) -> dict:
        return {
            "name": task.name,
            "versions": [MODEL_VERSION],
            "platform": "bertvision",
            "inputs": tensor_metadata(input_tensors(task)),
            "outputs": tensor_metadata(output_tensors(task)),
            "parameters": {"kind": task.kind, "heads": list(task.heads), "default_head": task.picked},
        }

    def guarded(handler):
        @functools.wraps(handler)
        async def run(*args, **kwargs):
            try:
                return await handler(*args, **kwargs)
            except RequestError as err:
                return v2_error(err)
            except Overloaded as err:
                return JSONResponse({"error": str(err)}, status_code=503)

        return run

    @router.api_route("", methods=READ)
    async def server_metadata() -> dict:
        """Server name, version and protocol extensions."""
        return {"name": "bertvision", "version": __version__, "extensions": ["binary_tensor_data"]}

    @router.api_route("/health/live", methods=READ)
    async def live() -> dict:
        """200 while the process answers."""
        return {"live": True}

    @router.api_route("/health/ready", methods=READ)
    async def ready():
        """200 once the model is loaded and warmed, 503 before."""
        return {"ready": True} if is_ready() else JSONResponse({"ready": False}, status_code=503)

    @router.api_route("/models", methods=READ)
    async def models() -> dict:
        """Every model (task) this service answers, with its kind and readiness."""
        return {
            "models": [
                {"name": n, "versions": [MODEL_VERSION], "kind": t.kind, "ready": is_ready()}
                for n, t in service.tasks.items()
            ]
        }

    @router.api_route("/models/{name}", methods=READ)
    @router.api_route("/models/{name}/versions/{version}", methods=READ)
    @guarded
    async def metadata(name: str, version: str | None = None):
        """The model's input and output tensors, its heads and default head."""
        return model_metadata(model(name, version))

    @router.api_route("/models/{name}/ready", methods=READ)
    @router.api_route("/models/{name}/versions/{version}/ready", methods=READ)
    @guarded
    async def model_ready(name: str, version: str | None = None):
        """200 once the model is ready, 503 before."""
        model(name, version)
        return (
            {"name": name, "ready": True}
            if is_ready()
            else JSONResponse({"name": name, "ready": False}, status_code=503)
        )

    @router.post("/models/{name}/infer")
    @router.post("/models/{name}/versions/{version}/infer")
    @guarded
    async def infer(name: str, http: Request, version: str | None = None):
        """Answer a batch of inputs for one task (tensors as in the model's metadata)."""
        task = model(name, version)
        request, tail = split_body(await http.body(), http.headers.get(HEADER_LENGTH))
        if not isinstance(request.get("id", ""), str):
            raise ProtocolError("id", f"a request's id is a string, not {request['id']!r}")
        if printable(request.get("id", "")) != request.get("id", ""):  # echoed in the answer, which UTF-8 cannot carry
            raise ProtocolError("id", "not valid Unicode (a lone surrogate)")
        head = _object(request.get("parameters"), "parameters").get("head")
        if head is not None and not isinstance(head, str):
            raise ProtocolError("parameters.head", "a head's name (a string)")
        body = as_predict_request(task, read_inputs(request, tail, task), head)
        outputs = asked_outputs(task, request)
        try:
            texts, questions = build_items(body, service, settings)
        except RequestError as err:
            raise ProtocolError(
                protocol_field(err.field, task), err.message, 400 if err.status == 422 else err.status
            ) from None
        text_results, question_results = await unless_client_gone(http, submit(texts, questions))
        per_item = question_results if task.takes_questions else text_results
        return infer_response(task, request, outputs, [answers[task.name] for answers in per_item])

    return router
