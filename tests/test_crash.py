"""Crashes leave nothing to repair by hand: the whole Snakemake process group is SIGKILLed in the
middle of fine-tuning and then in the middle of extraction; plain `snakemake` (after
`--unlock`, when Snakemake left its lock) finishes the run, its tables equal an uninterrupted
run's, and no temporary file or scratch directory is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, SHIPPED_GLUE, snakemake, snakemake_command

pytestmark = pytest.mark.slow


def crash_config(tiny_bert: Path) -> dict:
    """Small batches over a thousand rows, so that fine-tuning and extraction each take seconds
    (long enough to be killed midway) with the tiny model."""
    return {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {"glue_dir": str(SHIPPED_GLUE)},
        "tasks": {"mrpc": {"train_size": 1000, "eval_size": 40}},
        "finetune": {"epoch_fractions": [0, 1.0], "settings": {"batch_size": 4}},
        # the baseline (not what is killed here) at one seed, one epoch and larger batches: at
        # its defaults (3 seeds x 3 epochs of batches of 4) it took most of this test's minutes
        "baseline": {"epochs": 1, "seeds": [1], "settings": {"batch_size": 32}},
        "extract": {"batch_size": 1},
        "resources": {"threads": 1},  # one thread per fine-tuning job too: two jobs share the 2 cores
        "heads": {
            "seeds": [1, 2],
            "training": {"max_epochs": 3, "patience": 2},
            "models": {"lp": {"type": "lp"}, "adapter8": {"type": "adapter", "width": 8}},
        },
    }


def start(workdir: Path) -> subprocess.Popen:
    """Snakemake in a process group of its own, as a terminal would start it."""
    cmd = snakemake_command(workdir, "--cores", "2")
    return subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_when(proc: subprocess.Popen, ready, what: str, timeout: float = 300) -> None:
    """SIGKILL the whole process group of ``proc`` as soon as ``ready()`` holds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def leftovers(workdir: Path) -> list[str]:
    """Temporary files and scratch directories anywhere in the working directory."""
    return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*.tmp*") if ".snakemake" not in p.parts)


def test_killed_runs_finish_with_plain_snakemake_and_equal_tables(tiny_bert, tmp_path):
    config = crash_config(tiny_bert)
    clean = tmp_path / "uninterrupted"
    crashed = tmp_path / "crashed"
    for workdir in (clean, crashed):
        workdir.mkdir()
        (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake(clean)

    ckpt = crashed / "models/tiny/mrpc/ft1"
    proc = start(crashed)
    kill_when(proc, lambda: (ckpt / "ckpt-0/train.json").exists(), "fine-tuning past its first checkpoint")
    assert not (ckpt / "ckpt-1/train.json").exists(), "fine-tuning finished before the kill"

    # After a SIGKILL Snakemake's lock stays: --unlock, then the plain command again.
    snakemake(crashed, "--unlock")
    scratch = crashed / "features/tiny/mrpc/ft1/ckpt-1/.shard-0-of-1.tmp"
    proc = start(crashed)
    kill_when(proc, lambda: (scratch / ".train.h5.tmp").exists(), "extraction of the 1-epoch checkpoint")
    assert not scratch.with_name("shard-0-of-1").exists()

    snakemake(crashed, "--unlock")
    snakemake(crashed)
    assert leftovers(crashed) == []
    for name in ("glue", "cost"):
        assert (crashed / f"results/tables/{name}.csv").exists()
    pd.testing.assert_frame_equal(
        pd.read_csv(crashed / "results/tables/glue.csv"), pd.read_csv(clean / "results/tables/glue.csv")
    )
    assert "Nothing to be done" in snakemake(crashed, "-n").stdout
