"""The benchmark script runs end to end on a CPU (CI has no GPU): the stored-vs-streamed table
and the extraction-throughput figure (the GPU measurement) both come out of one real run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def run_benchmark(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_forward_flops_of_bert_base_at_128_tokens():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from benchmark import forward_flops
    finally:
        sys.path.remove(str(REPO / "scripts"))
    # 85M encoder parameters in matmuls, 2 FLOPs each per token, plus attention's T^2 terms
    assert forward_flops(12, 768, 128, 3072) == 2 * 128 * 12 * (4 * 768**2 + 2 * 768 * 3072) + 4 * 12 * 128**2 * 768
    assert 21e9 < forward_flops(12, 768, 128, 3072) < 23e9


def test_throughput_runs_on_a_cpu():
    out = run_benchmark("--throughput-only", "--throughput-seconds", "0.5", "--throughput-batch", "2", "--threads", "1")
    rate = re.search(r"128 tokens, batch 2, \w+ on .*: ([\d,]+) sequences/s", out)
    assert rate and float(rate.group(1).replace(",", "")) > 0, out


def test_stored_and_streamed_side_by_side():
    out = run_benchmark(
        "--task",
        "mrpc",
        "--rows",
        "80",
        "--repeats",
        "1",
        "--throughput-seconds",
        "0.5",
        "--throughput-batch",
        "2",
        "--threads",
        "1",
    )
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^(stored|streamed)\s+([\d,]+)\s", out, re.MULTILINE)}
    assert set(rows) == {"stored", "streamed"}, out
    assert int(rows["stored"].replace(",", "")) > 0 and rows["streamed"] == "0"
