"""The benchmark script runs end to end on a CPU (CI has no GPU): the stored-vs-streamed table
and the extraction-throughput figure (the GPU measurement) both come out of one real run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
    """Both paths measured, and the stored bytes near their minimum, which counts every kind of
    state the shards hold ([CLS] and token mean: two rows an example, not one)."""
    out = run_benchmark(
        "--task", "mrpc", "--rows", "40", "--eval-rows", "40", "--repeats", "1",
        "--throughput-seconds", "0.5", "--throughput-batch", "2", "--threads", "1",
    )  # fmt: skip
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^(stored|streamed)\s+([\d,]+)\s", out, re.MULTILINE)}
    assert set(rows) == {"stored", "streamed"}, out
    assert int(rows["stored"].replace(",", "")) > 0 and rows["streamed"] == "0"
    ratio = re.search(r"^feature bytes on disk / minimum\s+([\d.]+) .* x 7 layers x 768 wide$", out, re.MULTILINE)
    assert ratio and 1.0 <= float(ratio.group(1)) <= 1.10, out


def test_the_gpu_check_dry_runs_on_a_cpu(tmp_path):
    """scripts/gpu_check.sh, prepared for a session that is lent a GPU, runs here as a dry run: the
    default workflow's plan from a fresh copy of the commit, the bert-base throughput for a
    second, two steps of stacked heads, and its results file naming the device; without
    --dry-run and a GPU it refuses."""
    import os

    env = {**os.environ, "PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = tmp_path / "gpu-check.md"
    run = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", str(out)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    assert "GPU: none (dry run" in text and re.search(r"dry run: \d+ jobs planned", text)
    assert re.search(r"^baseline\s+\d+$", text, re.M) and "sequences/s" in text
    # the stacked heads' step ran (two steps on the CPU); the dry run stores no states to train on
    assert re.search(r"3 heads: one by one [\d.]+ ms, stacked by hand [\d.]+ ms .*vmap [\d.]+ ms", text), text
    assert "(no stored STS-B states" in text
    import shutil

    if shutil.which("nvidia-smi") is None:
        refused = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, env=env, capture_output=True,
                                 text=True)  # fmt: skip
        assert refused.returncode == 2 and "no GPU here" in refused.stderr
