"""The GPU code paths (autocast, device choice) also run on CPU, with close results."""

import logging
import os

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings
from bertvision.features.store import read_shard
from bertvision.runtime import device as device_module
from bertvision.runtime.device import autocast_dtype, cpu_has_native_bf16, pick_device, resolve_precision
from bertvision.runtime.precision import AUTO_PRECISION_ENV, choose_precision, cpu_flags
from bertvision.stages.extract import extract_shard

ATTRS = {"model": "tiny", "task": "sst2", "checkpoint": "0", "ft_seed": 1, "label_kind": "classification"}


def test_auto_device_is_cpu_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert pick_device("auto").type == "cpu"
    cpu = torch.device("cpu")
    expected = choose_precision("auto", "cpu", False, cpu_has_native_bf16(), os.environ.get(AUTO_PRECISION_ENV))
    assert resolve_precision(cpu, "auto") == expected
    assert autocast_dtype(cpu, "auto") == {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[expected]
    from bertvision.errors import BertvisionError

    with pytest.raises(BertvisionError, match="no CUDA device is visible"):  # one line, no traceback
        pick_device("cuda")


@pytest.mark.parametrize(
    ("device_type", "cuda_bf16", "cpu_bf16", "expected"),
    [
        ("cpu", False, True, "bf16"),  # AVX512-BF16 / AMX: native, fast
        ("cpu", False, False, "fp32"),  # emulated bf16 is several times slower than fp32
        ("cuda", True, False, "bf16"),
        ("cuda", False, False, "fp16"),  # a GPU without bf16
    ],
)
def test_auto_precision_is_what_the_hardware_runs_fast(device_type, cuda_bf16, cpu_bf16, expected):
    assert choose_precision("auto", device_type, cuda_bf16, cpu_bf16) == expected
    for explicit in ("fp32", "bf16", "fp16"):  # an explicit precision is kept, whatever the hardware
        assert choose_precision(explicit, device_type, cuda_bf16, cpu_bf16) == explicit
    assert choose_precision("auto", device_type, cuda_bf16, cpu_bf16, forced="fp32") == "fp32"
    for forced in ("int8", "auto"):  # a forced precision is one to compute in, not another choice
        with pytest.raises(ValueError, match=AUTO_PRECISION_ENV):
            choose_precision("auto", device_type, cuda_bf16, cpu_bf16, forced=forced)
    with pytest.raises(ValueError, match="expected one of"):
        choose_precision("half", device_type, cuda_bf16, cpu_bf16)


def test_native_bf16_is_read_from_the_cpu():
    flags = cpu_flags()
    if not flags:
        pytest.skip("/proc/cpuinfo has no flags here")
    native = bool({"avx512_bf16", "amx_bf16", "bf16"} & flags)
    assert cpu_has_native_bf16() == native


def test_explicit_bf16_on_a_cpu_without_it_warns_once(monkeypatch, caplog):
    """No CPU without native bf16 is at hand in CI, so the hardware check is what is replaced."""
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: False)
    monkeypatch.delenv(AUTO_PRECISION_ENV, raising=False)
    device_module._resolve.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="bertvision.runtime.device"):
            cpu = torch.device("cpu")
            assert [resolve_precision(cpu, "bf16") for _ in range(3)] == ["bf16"] * 3
            assert resolve_precision(cpu, "auto") == "fp32"
        warnings = [r for r in caplog.records if "without native bf16" in r.getMessage()]
        assert len(warnings) == 1 and "slower than fp32" in warnings[0].getMessage()
    finally:
        device_module._resolve.cache_clear()


def write_tokens(tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    lengths = rng.integers(5, 30, n)
    tokens = pd.DataFrame(
        {
            "idx": np.arange(n),
            "input_ids": [np.r_[101, rng.integers(1000, 5000, k - 2), 102].astype(np.int32) for k in lengths],
            "token_type_ids": [np.zeros(k, np.int8) for k in lengths],
            "length": lengths.astype(np.int32),
            "label": rng.integers(0, 2, n),
        }
    )
    (tmp_path / "tokens").mkdir()
    tokens.to_parquet(tmp_path / "tokens" / "train.parquet")
    return n


def test_bf16_autocast_extraction_matches_fp32(tmp_path, tiny_bert):
    n = write_tokens(tmp_path)
    states = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision / "shard-0-of-1"
        extract_shard(
            tiny_bert,
            tmp_path / "tokens",
            out,
            0,
            1,
            ["train"],
            ExtractSettings(batch_size=8, block_rows=16, block_tokens=65536),
            ExtractCompute(device="cpu", precision=precision, backend="torch"),
            ATTRS,
            threads=1,
        )
        states[precision] = read_shard(out / "train.h5")[0].astype(np.float32)
    assert states["fp32"].shape == (n, 3, 32)
    assert np.abs(states["fp32"] - states["bf16"]).max() < 0.1
    assert not np.array_equal(states["fp32"], states["bf16"])  # autocast really ran in bf16


@pytest.mark.parametrize("attrs", [ATTRS, {**ATTRS, "features": "tokens"}], ids=["cls", "tokens"])
def test_extraction_spread_over_device_replicas_equals_one_device(tmp_path, tiny_bert, attrs):
    """A job given several GPUs runs one encoder replica per GPU; two CPU replicas take the
    same code path here, and must write the same features as one."""
    from bertvision.features.store import read_token_shard

    write_tokens(tmp_path)
    settings = ExtractSettings(batch_size=4, block_rows=16, block_tokens=200)
    compute = ExtractCompute(device="cpu", precision="fp32", backend="torch")
    outs = {}
    for replicas in (1, 2):
        out = tmp_path / f"replicas{replicas}" / "shard-0-of-1"
        extract_shard(
            tiny_bert,
            tmp_path / "tokens",
            out,
            0,
            1,
            ["train"],
            settings,
            compute,
            attrs,
            threads=1,
            devices=[torch.device("cpu")] * replicas,
        )
        outs[replicas] = out / "train.h5"
    one, two = read_shard(outs[1]), read_shard(outs[2])
    for a, b in zip(one, two):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=2e-3)
    if attrs.get("features") == "tokens":
        np.testing.assert_allclose(
            read_token_shard(outs[1]).states.astype(np.float32),
            read_token_shard(outs[2]).states.astype(np.float32),
            atol=2e-3,
        )


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_parallel_jobs_claim_different_gpus_and_release_them_on_exit(tmp_path):
    """Three processes, two slots: two hold distinct slots; the third waits until one of them
    is killed and then takes exactly its slot."""
    import subprocess
    import sys

    script = (
        "import time; from bertvision.runtime.device import claim_slot; "
        f"i = claim_slot(2, {str(tmp_path)!r}, poll_seconds=0.1); print(i, flush=True); time.sleep(60)"
    )
    holders = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    slots = [int(h.stdout.readline()) for h in holders]
    assert sorted(slots) == [0, 1]
    waiting = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.communicate(timeout=8)  # both slots are held: it must still be waiting
        holders[1].kill()
        holders[1].wait()
        line = waiting.stdout.readline()
        assert int(line) == slots[1]
    finally:
        for proc in (*holders, waiting):
            proc.kill()
