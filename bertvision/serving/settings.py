"""What ``bertvision serve`` runs with: the one owner of the service's defaults (the app reads
them, and ``bertvision serve --help`` shows them); and what ``bertvision bundle`` records of each
task's tokenization. Kept free of FastAPI so that the command line builds its help cheaply."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from bertvision.errors import SettingsError
from bertvision.runtime.precision import Backend


@dataclass(frozen=True)
class ServeSettings:
    max_batch_size: int = 32  # inputs (texts + questions) per model call
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    max_texts: int = 64
    max_body_bytes: int = 1_000_000
    max_text_chars: int = 20_000  # per text, question or context
    max_windows: int = 64  # span tasks: context windows per question
    max_batch_tokens: int = 8192  # padded tokens per encoder forward call (bounds memory; a batch above it is split)
    # sequences per encoder forward call: a batch's sequences, sorted by length, go through in
    # chunks of at most this many, so that short texts are not padded to the batch's longest
    # (0: the whole batch in one call). With pad_multiple 8: 1.26x the requests per second of one
    # call padded to a multiple of 32 on PyTorch, 1.28x on int8 (docs/results/onnx-backend-xeon-amx.md)
    max_chunk_rows: int = 16
    max_queued: int = 1024  # waiting requests; more get 503
    # each forward call padded to a width that is a multiple of this: a few shapes, so that native
    # caches kept per shape (oneDNN kernels, freed heap) stay bounded (docs/serving.md, memory;
    # 8 against 32: docs/results/serve-memory-pad-multiple-xeon-amx.txt)
    pad_multiple: int = 8
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Backend | None = None  # torch, onnx or onnx-int8 (ONNX Runtime, CPU); None: each bundle's own
    # torch threads per worker process (None: torch's default; CPU cores / workers for several workers)
    threads: int | None = None

    def __post_init__(self):
        """A bound that would refuse every request, or a batch no call could take, fails at the start in
        one line naming its flag (it started a server that refused everything, or failed at start-up)."""
        least = {name: 1 for name in ("max_batch_size", "max_texts", "max_body_bytes", "max_text_chars", "max_windows",
                                      "max_batch_tokens", "max_queued", "pad_multiple", "threads")}  # fmt: skip
        least |= {"max_chunk_rows": 0, "max_wait_ms": 0}
        for name, lowest in least.items():
            value = getattr(self, name)
            if value is not None and value < lowest:
                raise SettingsError(f"--{name.replace('_', '-')}: {value}; at least {lowest}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeSettings:
        data = json.loads(text)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"serve settings: unknown keys {unknown}")
        return cls(**data)


DEFAULTS = ServeSettings()  # for a command or an engine made without the app


class BundleTaskSettings(BaseModel):
    """One task's tokenization as its features used it (``bertvision bundle --task-settings``);
    a key left out, or null, is the task registry's. ``heads``: the heads served (null: every one
    its heads directories hold)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    max_length: int | None = None
    doc_stride: int | None = None
    heads: list[str] | None = None


# --task-settings: {task: BundleTaskSettings}
BUNDLE_TASK_SETTINGS = TypeAdapter(dict[str, BundleTaskSettings])


def checked_task_settings(given: dict) -> dict:
    """--task-settings as {task: {max_length, doc_stride, heads}} (set ones only), or one line naming the key."""
    try:
        task_settings = BUNDLE_TASK_SETTINGS.validate_python(given)
    except ValidationError as err:
        first = err.errors()[0]
        where, what = "".join(f"{p}: " for p in first["loc"]), first["msg"][0].lower() + first["msg"][1:]
        expected = "{task: {max_length, doc_stride, heads}}"
        raise SettingsError(f"--task-settings: {where}{what} (expected {expected})") from None
    return {name: settings.model_dump(exclude_none=True) for name, settings in task_settings.items()}
