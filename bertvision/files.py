"""Small file helpers: every artifact is written to a temporary name and renamed into place,
so a killed job never leaves a file that looks complete. The temporary name is fixed (one job
writes each artifact), so a rerun after a kill replaces what the killed job left. Whatever wrote
it, an artifact gets the mode an ordinary new file gets here (0o666 less the umask): safetensors
0.8 writes its files 0o600 (safetensors/safetensors#782), and a service or a colleague running as
another user could not read the weights beside a readable config.json."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd

from bertvision.errors import DataFormatError

NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a write found the disk full, or the user's quota spent


@functools.cache
def new_file_mode() -> int:
    """The mode ``open`` gives a new file in this process: 0o666 less the umask (read from
    /proc, since setting the umask to read it would race with other threads)."""
    with contextlib.suppress(OSError, AttributeError):
        status = Path("/proc/self/status").read_text()
        return 0o666 & ~int(re.search(r"^Umask:\s*([0-7]+)", status, re.MULTILINE).group(1), 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def with_new_file_modes(path: Path) -> None:
    """Give the file ``path``, or every file below the directory ``path``, ``new_file_mode()``."""
    path = Path(path)
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]:
        os.chmod(file, new_file_mode())


@contextlib.contextmanager
def atomic_path(path: Path):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        with_new_file_modes(tmp)
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
        with_new_file_modes(scratch)
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


class RepeatedKey(ValueError):
    """A JSON object that gives a key twice (json keeps the last one silently)."""


def object_once(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' ``object_pairs_hook`` that refuses a key given twice (RepeatedKey: the key)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        raise RepeatedKey(next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1))
    return record


def read_json(path: Path):
    """A JSON record; one that is cut short or garbled (a job killed while another tool wrote it)
    is a DataFormatError naming the file and the line."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from None


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def no_such_file(path) -> str:
    """The line for a missing ``path`` (or a folder where a file belongs), naming the working
    directory a relative one was looked for in: a config's paths are read from the run's working
    directory (``snakemake --directory`` moves it), not from the config file's."""
    path = Path(path)
    where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
    return f"{path}: a folder, not a file{where}" if os.path.isdir(path) else f"{path}: no such file{where}"


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found no room: an OSError with errno ENOSPC (or EDQUOT),
    or an h5py error, which carries the errno in its message only."""
    return getattr(err, "errno", None) in NO_ROOM or any(f"errno = {code}," in str(err) for code in NO_ROOM)
