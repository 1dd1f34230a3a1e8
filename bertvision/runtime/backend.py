"""Which runtime runs a frozen encoder's forward passes (``extract.backend``, ``serve
--backend``): PyTorch, or ONNX Runtime on the CPU (``models.onnx_encoder``), and for ``auto``
whichever measures faster on this machine and encoder, once (the precision probe's cache)."""

from __future__ import annotations

import logging
import time

import torch

from bertvision.errors import SettingsError
from bertvision.models.onnx_encoder import OnnxEncoder, onnx_runtime
from bertvision.runtime.device import autocast, resolve_precision
from bertvision.runtime.precision_probe import cache_file, device_name, measured_once, probe_key

log = logging.getLogger(__name__)

PROBE_BATCH, PROBE_TOKENS, PROBE_REPEATS = 32, 64, 5
# ``auto`` takes ONNX Runtime only when it is clearly faster: on the 2-core EPYC the two fp32
# forwards measured within 8% of each other, either way, from one run to the next
# (docs/results/onnx-backend-amd-epyc.md), and a choice that flips on noise helps no one.
AUTO_MARGIN = 1.1


def with_backend(model, backend: str, threads: int | None = None, precision: str = "fp32"):
    """``model`` itself for ``torch``, else ``model`` run by ONNX Runtime (on the CPU only);
    ``auto``: whichever of the two ``measured_backend`` finds faster, PyTorch computing in
    ``precision`` as its passes will (PyTorch on a GPU)."""
    device = next(model.parameters()).device
    if backend == "auto":
        try:
            backend = measured_backend(model, precision) if device.type == "cpu" else "torch"
        except SettingsError as err:  # no onnxruntime here, or an encoder it cannot run: PyTorch, as on a GPU
            log.warning("backend auto: %s; running PyTorch", err)
            backend = "torch"
    if backend == "torch":
        return model
    if device.type != "cpu":
        raise ValueError(f"backend {backend}: ONNX Runtime runs the encoder on the CPU here, not on {device}")
    return OnnxEncoder(model, backend, threads)


def backend_precision(device: torch.device, precision: str, model, backend: str) -> str:
    """``resolve_precision`` for the encoder ``model`` run by ``backend``: fp32 for ONNX Runtime,
    which computes its activations in fp32 (int8 weights or not) and takes no autocast."""
    return resolve_precision(device, precision, model) if backend == "torch" else "fp32"


def backend_of(model) -> str:
    """The backend that runs ``model`` (``with_backend``'s answer)."""
    return model.backend if isinstance(model, OnnxEncoder) else "torch"


def forward_seconds(model, backend: str, precision: str = "fp32", repeats: int = PROBE_REPEATS) -> float:
    """The fastest of ``repeats`` forward passes (every hidden state) of ``model`` run by ``backend``
    (PyTorch under ``precision``'s autocast) over a batch of ``PROBE_BATCH`` random sequences of
    ``PROBE_TOKENS`` tokens, after one to warm up: the fastest, as a pass that other work on the
    machine slowed down says nothing of the backend."""
    runner = with_backend(model, backend)
    ids = torch.randint(1000, 2000, (PROBE_BATCH, PROBE_TOKENS), generator=torch.Generator().manual_seed(0))
    times = []
    with torch.inference_mode(), autocast(torch.device("cpu"), precision if backend == "torch" else "fp32"):
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            runner(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
            times.append(time.perf_counter() - t0)
    return min(times[1:])


def measured_backend(model, precision: str = "fp32") -> str:
    """``onnx`` where ONNX Runtime's fp32 forward of ``model`` is at least ``AUTO_MARGIN`` times as
    fast as PyTorch's in ``precision`` (bf16 autocast, where ``auto`` resolves to it) on this
    machine, else ``torch``; measured once per machine, thread count, versions, encoder shape and
    precision (the precision probe's cache); a pass is timed by ``forward_seconds``."""
    onnxruntime = onnx_runtime()
    resolved = resolve_precision(torch.device("cpu"), precision, model)

    def measure_both() -> dict:
        seconds = {backend: forward_seconds(model, backend, resolved) for backend in ("torch", "onnx")}
        choice = "onnx" if seconds["onnx"] * AUTO_MARGIN <= seconds["torch"] else "torch"
        log.info(
            "backend auto: measured a forward pass of this encoder on %s: torch (%s) %.1f ms, onnx %.1f ms -> %s "
            "(cached in %s)", device_name(torch.device("cpu")), resolved, 1e3 * seconds["torch"], 1e3 * seconds["onnx"],
            choice, cache_file(),
        )  # fmt: skip
        return {"choice": choice, "seconds": seconds, "onnxruntime": onnxruntime.__version__}

    key = f"backend-{probe_key(model.config)}-{resolved}-ort{onnxruntime.__version__}"
    return measured_once(key, measure_both)["choice"]
