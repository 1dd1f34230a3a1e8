"""precision: auto on a CPU that lists native bf16 is measured on the run's encoder shape (a CPU
flag is not a speed), cached per machine and shape; without the flag it is fp32, unmeasured."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from bertvision.runtime import device as device_module
from bertvision.runtime import precision_probe
from bertvision.runtime.device import resolve_precision
from bertvision.runtime.precision import AUTO_PRECISION_ENV

CPU = torch.device("cpu")


@pytest.fixture
def encoder(tiny_bert):
    return AutoModel.from_pretrained(tiny_bert)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "precision.json"))
    monkeypatch.delenv(AUTO_PRECISION_ENV, raising=False)
    device_module._resolve.cache_clear()
    yield tmp_path / "precision.json"
    device_module._resolve.cache_clear()


def flagged_bf16(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: native)
    device_module._resolve.cache_clear()


def test_a_cpu_listing_bf16_gets_the_faster_precision_as_measured_and_caches_it(encoder, cache, monkeypatch):
    flagged_bf16(monkeypatch, True)
    chosen = resolve_precision(CPU, "auto", encoder)
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert chosen == entry["choice"] == min(entry["seconds"], key=entry["seconds"].get)
    assert set(entry["seconds"]) == {"fp32", "bf16"} and all(s > 0 for s in entry["seconds"].values())
    # measured once per machine and shape: the next job reads the cache
    monkeypatch.setattr(precision_probe, "step_seconds", lambda *a, **k: pytest.fail("measured twice"))
    assert resolve_precision(CPU, "auto", encoder) == chosen


def test_a_forced_slow_bf16_path_makes_auto_pick_fp32_despite_the_flag(encoder, cache, monkeypatch):
    measure = precision_probe.step_seconds

    def slow_bf16(config, precision, steps=precision_probe.STEPS, device=CPU):
        if precision == "bf16":
            time.sleep(0.2)  # inside the timed step: what a CPU that emulates bf16 costs
        return measure(config, precision, steps, device) + (0.2 if precision == "bf16" else 0.0)

    monkeypatch.setattr(precision_probe, "step_seconds", slow_bf16)
    flagged_bf16(monkeypatch, True)
    assert resolve_precision(CPU, "auto", encoder) == "fp32"
    assert resolve_precision(CPU, "auto") == "bf16"  # no encoder to measure: the flag rule, the fallback


def test_without_the_flag_auto_is_fp32_and_nothing_is_measured(encoder, cache, monkeypatch):
    monkeypatch.setattr(precision_probe, "step_seconds", lambda *a, **k: pytest.fail("measured"))
    flagged_bf16(monkeypatch, False)
    assert resolve_precision(CPU, "auto", encoder) == "fp32" and not cache.exists()
    assert resolve_precision(CPU, "bf16", encoder) == "bf16"  # an explicit precision is kept


def test_a_forced_precision_is_not_measured(encoder, cache, monkeypatch):
    monkeypatch.setattr(precision_probe, "step_seconds", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setenv(AUTO_PRECISION_ENV, "bf16")
    flagged_bf16(monkeypatch, True)
    assert resolve_precision(CPU, "auto", encoder) == "bf16"


def _timed_step_with_a_log(config, precision, steps=precision_probe.STEPS, device=CPU):
    """A step timer that records each call in the folder named by MEASURE_LOG and answers from the
    process id, so that processes measuring on their own would disagree."""
    import os

    log = Path(os.environ["MEASURE_LOG"]) / f"{os.getpid()}-{precision}"
    log.touch()
    time.sleep(0.3)
    return (1.0 if precision == "bf16" else 2.0) if os.getpid() % 2 else (2.0 if precision == "bf16" else 1.0)


def _choose_in_a_job(config, queue):
    queue.put(precision_probe.measured_precision(config, measure=_timed_step_with_a_log))


def test_jobs_starting_together_measure_once_and_agree(encoder, cache, tmp_path, monkeypatch):
    """Seven jobs starting at once on one GPU each measured while the others ran and chose fp32 four
    times and bf16 three (docs/results/gpu-check-nvidia-h200.md): the first job measures and the
    others wait for its entry."""
    import multiprocessing

    monkeypatch.setenv("MEASURE_LOG", str(tmp_path))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    jobs = [context.Process(target=_choose_in_a_job, args=(encoder.config, queue)) for _ in range(4)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(30)
    choices = [queue.get(timeout=5) for _ in jobs]
    measured = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(("-fp32", "-bf16")))
    assert len(measured) == 2, measured  # one process timed both precisions
    assert len(set(choices)) == 1 and choices[0] == json.loads(cache.read_text()).popitem()[1]["choice"]


def test_measuring_leaves_the_seeded_random_stream_as_it_was(encoder, cache, monkeypatch):
    """The first job on a machine measures, later ones read the cache: both must train alike. A
    baseline seeded 3 on CoLA scored 0.279 MCC where it measured and 0.231 where it read the cache
    (the probe reseeded torch's generator and drew the random copy's weights from it)."""
    flagged_bf16(monkeypatch, True)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    resolve_precision(CPU, "auto", encoder)  # measures: the cache is empty
    assert cache.is_file()
    assert torch.equal(torch.rand(4), expected)


def test_a_cache_it_cannot_make_or_read_costs_only_a_new_measurement(tmp_path, monkeypatch):
    """A cache folder with a file in its way measures without caching; a cache that is not JSON
    (edited by hand) is measured over; an entry under another key stays beside the new one."""
    calls = []

    def measure(choice="fp32"):
        calls.append(choice)
        return {"choice": choice}

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "a-file" / "precision.json"))
    assert precision_probe.measured_once("k", measure) == {"choice": "fp32"} and calls == ["fp32"]
    cache = tmp_path / "precision.json"
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(cache))
    cache.write_text("{not json")
    assert precision_probe.measured_once("k", measure) == {"choice": "fp32"} and len(calls) == 2
    assert precision_probe.measured_once("other", lambda: measure("bf16")) == {"choice": "bf16"}
    assert json.loads(cache.read_text()) == {"k": {"choice": "fp32"}, "other": {"choice": "bf16"}}
    assert precision_probe.measured_once("k", measure) == {"choice": "fp32"} and len(calls) == 3  # read, not measured


def test_a_measurement_holds_for_one_thread_count_and_encoder_shape(encoder):
    threads = torch.get_num_threads()
    key = precision_probe.probe_key(encoder.config)
    wider = encoder.config.__class__.from_dict({**encoder.config.to_dict(), "intermediate_size": 999})
    assert precision_probe.probe_key(wider) != key
    torch.set_num_threads(threads + 1)
    try:
        assert precision_probe.probe_key(encoder.config) != key
    finally:
        torch.set_num_threads(threads)
