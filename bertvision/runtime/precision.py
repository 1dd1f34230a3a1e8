"""Which precision a run computes in: the configured one, or for ``auto`` what the hardware runs
fast. Torch-free (the config schema reads ``PRECISIONS``); ``runtime.device`` asks the hardware."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

Precision = Literal["auto", "fp32", "bf16", "fp16"]
PRECISIONS = get_args(Precision)
# What runs the frozen encoder's forward passes: PyTorch, or ONNX Runtime on the CPU with fp32 or
# int8 weights (``models.onnx_encoder``), whose activations are fp32 whatever the precision says.
# ``auto``: ONNX Runtime's fp32 where it measures clearly faster than PyTorch on the machine and
# the encoder, else PyTorch (``runtime.backend.measured_backend``); never int8, which changes
# the states.
Backend = Literal["torch", "onnx", "onnx-int8", "auto"]
BACKENDS = get_args(Backend)
BACKEND_LABELS = {"onnx": "ONNX Runtime", "onnx-int8": "ONNX Runtime, int8 weights"}


def computed_in(precision: str | None, backend: str | None = None) -> str | None:
    """What the tables say an encoder computed in: its precision, and the runtime when it was
    not PyTorch ("fp32 (ONNX Runtime, int8 weights)")."""
    if precision is None or backend in (None, "torch"):
        return precision
    return f"{precision} ({BACKEND_LABELS[backend]})"


# What `auto` resolves to, whatever the hardware offers (fp32, bf16 or fp16): lets the test suite
# and the benchmarks force one precision everywhere a config says auto.
AUTO_PRECISION_ENV = "BERTVISION_AUTO_PRECISION"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def choose_precision(
    precision: str, device_type: str, cuda_bf16: bool, cpu_bf16: bool, forced: str | None = None
) -> str:
    """The precision a run uses (fp32, bf16 or fp16) for the configured ``precision``: an explicit
    one as it is; ``auto`` = ``forced`` when given, else bf16 on a CUDA device that supports it
    (fp16 on older ones) and on a CPU with native bf16, fp32 on any other CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if forced:
        if forced not in PRECISIONS[1:]:
            raise ValueError(f"{AUTO_PRECISION_ENV}={forced!r}: expected one of {', '.join(PRECISIONS[1:])}")
        return forced
    if device_type == "cuda":
        return "bf16" if cuda_bf16 else "fp16"
    return "bf16" if cpu_bf16 else "fp32"
