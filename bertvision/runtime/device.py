"""Device placement and mixed precision. Every path runs on CPU when there is no GPU."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import time
from pathlib import Path

import torch

from bertvision.errors import DeviceError, SettingsError
from bertvision.runtime.precision import AUTO_PRECISION_ENV, choose_precision, cpu_flags

log = logging.getLogger(__name__)


def pick_device(preference: str = "auto") -> torch.device:
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return _local_gpu()
    if preference == "cuda":
        raise DeviceError(
            "device 'cuda' was requested (the config's finetune, extract or heads device, or serve --device) "
            "but no CUDA device is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return torch.device("cpu")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: x86 with AVX512-BF16 or AMX (torch's own CPU
    checks), or an Arm CPU whose features list ``bf16``. Elsewhere bf16 autocast is emulated and
    several times slower than fp32 (measured: about 3x on an Intel Xeon with AVX-512 but no bf16)."""
    cpu = torch.cpu
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        if getattr(cpu, check, lambda: False)():
            return True
    return "bf16" in cpu_flags()


@functools.cache
def _resolve(device_type: str, precision: str) -> str:
    cuda_bf16 = device_type == "cuda" and torch.cuda.is_bf16_supported()
    cpu_bf16 = device_type == "cpu" and cpu_has_native_bf16()
    chosen = choose_precision(precision, device_type, cuda_bf16, cpu_bf16, os.environ.get(AUTO_PRECISION_ENV) or None)
    if chosen == "bf16" and device_type == "cpu" and not cpu_bf16:
        log.warning(
            "precision bf16 on a CPU without native bf16 (no avx512_bf16 or amx_bf16): autocast emulates it, "
            "several times slower than fp32; precision: auto picks fp32 on this CPU"
        )
    return chosen


def resolve_precision(device: torch.device, precision: str, model=None) -> str:
    """The precision actually used on ``device`` for the configured ``precision`` (see
    ``choose_precision``); an explicit bf16 on a CPU without native bf16 logs one warning. With
    ``model`` (the encoder to run), ``auto`` where bf16 is on offer (a CPU that lists native
    bf16, a CUDA GPU that supports it) is measured on its shape on the device instead
    (``runtime.precision_probe``): the flag is only the fallback."""
    chosen = _resolve(device.type, precision)
    measurable = precision == "auto" and device.type in ("cpu", "cuda") and not os.environ.get(AUTO_PRECISION_ENV)
    if chosen == "bf16" and measurable and model is not None:
        from bertvision.runtime.precision_probe import measured_precision

        return measured_precision(model.config, device)
    return chosen


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``; None = no autocast (fp32)."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[resolve_precision(device, precision)]


def autocast(device: torch.device, precision: str):
    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_threads(threads: int | None) -> None:
    """``threads`` torch threads; None or 0: torch's own count."""
    if threads is not None and threads < 0:
        raise SettingsError(f"threads: {threads}; give a count of at least 1 (or none: torch's own)")
    if threads:
        torch.set_num_threads(int(threads))


def to_device(batch: dict, device: torch.device) -> dict:
    non_blocking = device.type == "cuda"
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


# Set to a batch size to make any forward pass over a larger (micro-)batch raise CUDA's
# out-of-memory error: lets the tests and a CPU cluster exercise the retry path.
SIMULATE_OOM_ENV = "BERTVISION_SIMULATE_OOM_ABOVE"


def check_simulated_oom(batch_rows: int) -> None:
    limit = os.environ.get(SIMULATE_OOM_ENV)
    if limit and batch_rows > int(limit):
        raise torch.OutOfMemoryError(
            f"simulated CUDA out of memory: a batch of {batch_rows} rows > {SIMULATE_OOM_ENV}={limit}"
        )


OUT_OF_MEMORY_EXIT = 3  # a job's exit status after CUDA ran out of memory


_claimed: list = []  # open lock files: a claim lasts as long as the process


def claim_slot(n_slots: int, lock_dir: Path, poll_seconds: float = 2.0) -> int:
    """Index of a slot (0..n-1) no other live process holds, via an exclusive lock on
    ``lock_dir/gpu-{i}.lock``; waits while all are taken. The OS drops the lock when the
    process ends, however it ends."""
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(n_slots):
            handle = open(lock_dir / f"gpu-{i}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            _claimed.append(handle)
            return i
        time.sleep(poll_seconds)


def _local_gpu() -> torch.device:
    """The GPU for this process. A scheduler (SLURM, torchrun) that assigns devices sets
    CUDA_VISIBLE_DEVICES or LOCAL_RANK; otherwise, with several GPUs on one workstation
    (profiles/local-gpu), each job claims a free one, so parallel jobs never share a device."""
    if "CUDA_VISIBLE_DEVICES" in os.environ or "LOCAL_RANK" in os.environ or torch.cuda.device_count() < 2:
        return torch.device("cuda")
    lock_dir = Path(os.environ.get("BERTVISION_GPU_LOCK_DIR", f"/tmp/bertvision-gpus-{os.getuid()}"))
    index = claim_slot(torch.cuda.device_count(), lock_dir)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
