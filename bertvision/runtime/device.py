"""Device placement and mixed precision. Every path runs on CPU when there is no GPU."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

import torch


def pick_device(preference: str = "auto") -> torch.device:
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return _local_gpu()
    if preference == "cuda":
        raise RuntimeError(
            "device 'cuda' was requested but no CUDA device is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return torch.device("cpu")


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for ``precision`` ('auto', 'fp32', 'bf16', 'fp16'); None = no autocast.
    'auto' is bf16 on GPUs that support it, fp16 on older GPUs, and fp32 on CPU."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


def autocast(device: torch.device, precision: str):
    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_threads(threads: int | None) -> None:
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
