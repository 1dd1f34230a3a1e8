"""A disk that fills up while an extraction job writes its features, for real: a small tmpfs
(skipped where mounting one is not permitted) that the test fills once the job has passed its
up-front space check and started writing. The job ends with one line naming the shard file
and the space the shard needed, exit status 2, no traceback, nothing of the shard kept; once
space is freed, the same command writes the shard."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time

import numpy as np
import pandas as pd
import pytest

from bertvision.features.store import read_shard
from tests.conftest import REPO
from tests.stages import BERTVISION, extract_args

ATTRS = {"model": "tiny", "task": "sst2", "checkpoint": "0", "ft_seed": 1, "label_kind": "classification"}
SPLIT_ROWS = {"train": 4000, "selection": 50, "dev": 50}


@contextlib.contextmanager
def small_disk(path, mib: int):
    """A tmpfs of ``mib`` MiB mounted on ``path``."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)], capture_output=True)
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(disk) -> None:
    """Take every free byte of ``disk``."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def fill_once_writing(disk, proc) -> threading.Thread:
    """Fill ``disk`` as soon as ``proc`` has a feature file open on it (past its space check)."""

    def watch():
        while proc.poll() is None:
            if any(disk.rglob("*.h5.tmp")):
                return fill(disk)
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def write_tokens(path) -> None:
    rng = np.random.default_rng(0)
    path.mkdir()
    for split, n in SPLIT_ROWS.items():
        lengths = rng.integers(8, 40, n)
        pd.DataFrame(
            {
                "idx": np.arange(n),
                "input_ids": [np.r_[101, rng.integers(1000, 5000, k - 2), 102].astype(np.int32) for k in lengths],
                "token_type_ids": [np.zeros(k, np.int8) for k in lengths],
                "length": lengths.astype(np.int32),
                "label": rng.integers(0, 2, n),
            }
        ).to_parquet(path / f"{split}.parquet")


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
@pytest.mark.parametrize("attrs", [ATTRS, {**ATTRS, "features": "tokens"}], ids=["cls", "tokens"])
def test_a_disk_that_fills_up_during_extraction_ends_in_one_line(tmp_path, tiny_bert, attrs):
    write_tokens(tmp_path / "tokens")
    with small_disk(tmp_path / "disk", mib=32) as disk:
        out = disk / "features" / "shard-0-of-1"
        settings = {"batch_size": 16, "block_rows": 256, "block_tokens": 4096}
        command = [*BERTVISION, *extract_args(tiny_bert, tmp_path / "tokens", settings, attrs, out_dir=out)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        fill_once_writing(disk, proc)
        _, stderr = proc.communicate(timeout=300)
        assert (disk / "filler").exists(), "the job finished before the disk could be filled"
        assert proc.returncode == 2, stderr[-3000:]
        assert "Traceback" not in stderr and f"errno = {errno.ENOSPC}" not in stderr, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]  # the job's log ends in the one line
        assert last.startswith(f"bertvision extract: error: {out}/"), last
        assert ".h5: the disk filled up while it was written (nothing of the shard is kept): the shard needs " in last
        assert " MiB of features and " in last and " MiB was free when it began;" in last
        assert sorted(p.relative_to(disk).as_posix() for p in disk.rglob("*")) == ["features", "filler"]

        (disk / "filler").unlink()
        rerun = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert len(read_shard(out / "train.h5")[2]) == SPLIT_ROWS["train"]
