"""Small file helpers: every artifact is written to a temporary name and renamed into place,
so a killed job never leaves a file that looks complete. The temporary name is fixed (one job
writes each artifact), so a rerun after a kill replaces what the killed job left."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd

NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a write found the disk full, or the user's quota spent


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Yield an empty scratch directory beside ``path``; it replaces ``path`` (a directory) only
    if the block succeeds, and is removed either way."""
    path = Path(path)
    scratch = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        yield scratch
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(scratch, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def atomic_write_json(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found no room: an OSError with errno ENOSPC (or EDQUOT),
    or an h5py error, which carries the errno in its message only."""
    return getattr(err, "errno", None) in NO_ROOM or any(f"errno = {code}," in str(err) for code in NO_ROOM)
