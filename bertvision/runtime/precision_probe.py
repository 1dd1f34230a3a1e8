"""``precision: auto`` decides by measuring, not by a flag, where bf16 is on offer: on a CPU that
lists native bf16 (a CPU flag is not a speed: bf16 autocast was 1.5x slower than fp32 for
MiniLM-L6 on an Intel Xeon that lists AVX512-BF16 but has no AMX) and on a CUDA GPU that
supports it. The probe times a few training steps (forward and backward) of a one-layer random
copy of the run's own encoder shape in fp32 and in bf16 autocast on the device, and picks the
faster; the choice and both timings are logged and cached per device, torch version, thread
count and encoder shape, so each machine measures once, one job at a time. A CPU without the flags gets fp32 with
no probe (bf16 is emulated there)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CACHE_ENV = "BERTVISION_PRECISION_CACHE"  # the cache file (default: ~/.cache/bertvision/precision.json)
SHAPE_KEYS = ("model_type", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings")
BATCH, TOKENS, STEPS = 8, 64, 3
CPU = torch.device("cpu")


def cache_file() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "bertvision" / "precision.json")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def probe_key(config, device: torch.device = CPU) -> str:
    """What a measurement holds for: this machine's device, torch, threads and the encoder's shape."""
    shape = {k: getattr(config, k, None) for k in SHAPE_KEYS}
    facts = {"cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(), **shape}
    if device.type != "cpu":
        facts["device"] = device_name(device)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(config, precision: str, steps: int = STEPS, device: torch.device = CPU) -> float:
    """Median seconds of one forward and backward step of a one-layer random copy of ``config``.
    The random copy and its dropout draw from a forked generator: the job that measures (the first
    on a machine) must go on with the same random stream as every later job that reads the cache,
    or its seeded training would differ from theirs."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        return _step_seconds(config, precision, steps, device)


def _step_seconds(config, precision: str, steps: int, device: torch.device) -> float:
    from transformers import AutoModel

    small = config.__class__.from_dict({**config.to_dict(), "num_hidden_layers": 1})
    model = AutoModel.from_config(small).to(device).train()
    ids = torch.randint(0, min(small.vocab_size, 1000), (BATCH, TOKENS), device=device)
    dtype = {"bf16": torch.bfloat16}.get(precision)
    times = []
    for _ in range(steps + 1):  # the first step warms up
        _synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            out = model(input_ids=ids).last_hidden_state
        out.float().pow(2).mean().backward()
        _synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def measured_precision(config, device: torch.device = CPU, measure=None) -> str:
    """fp32 or bf16, whichever trains the encoder shape of ``config`` faster on ``device`` (cached).
    ``measure``: how a step is timed (default ``step_seconds``, looked up when called)."""
    measure = measure or step_seconds
    name = device_name(device)

    def measure_both() -> dict:
        seconds = {precision: measure(config, precision, device=device) for precision in ("fp32", "bf16")}
        choice = min(seconds, key=seconds.get)
        log.info(
            "precision auto: measured a training step of this encoder's shape on %s: fp32 %.1f ms, bf16 %.1f ms "
            "-> %s (cached in %s)", name, 1e3 * seconds["fp32"], 1e3 * seconds["bf16"], choice, cache_file(),
        )  # fmt: skip
        return {"choice": choice, "seconds": seconds, "device": name, "torch": torch.__version__}

    return measured_once(probe_key(config, device), measure_both)["choice"]


def measured_once(key: str, measure) -> dict:
    """The cached entry under ``key``, or ``measure()``'s, measured and cached now. Jobs starting
    together on one machine take turns: the lock is held while measuring, so one job measures and
    the others read its entry. (Measured side by side on one GPU, seven jobs timed each other's
    work and chose fp32 four times and bf16 three: docs/results/gpu-check-nvidia-h200.md.) A cache
    that cannot be locked or written only costs a new measurement next time."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "w")
    except OSError as err:
        log.warning("precision auto: could not use the cache %s (%s)", path, err)
        return measure()
    with lock:
        t0 = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.perf_counter() - t0
        cached = _read(path).get(key)
        if cached:
            log.info("probe %s: %s, as cached (waited %.2f s for the cache's lock)", key, cached["choice"], waited)
            return cached
        log.info("probe %s: measuring (waited %.2f s for the cache's lock)", key, waited)
        entry = measure()
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**_read(path), key: entry}, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError as err:
            log.warning("precision auto: could not cache the measurement in %s (%s)", path, err)
        return entry


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
