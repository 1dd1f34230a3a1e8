"""The warm pool (``runtime.warm``) as the workflow's process runs it: started by the Snakefile's
onstart hook (through ``commands.warm.start``), stopped by its onsuccess/onerror hooks, and the
socket directories of pools killed with their Snakemake cleared at the next start."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from bertvision.runtime.warm import SOCKET_ENV

SOCKET_DIR_PREFIX = "bertvision-warm-"
# how long the workflow's start waits for the pool to listen (an interpreter and a light import)
BIND_WAIT_SECONDS = 10.0


class WarmPool:
    """A running warm process; ``stop()`` ends it and removes its socket."""

    def __init__(self, process, socket_dir: Path):
        self.process, self.socket_dir = process, socket_dir

    def stop(self) -> None:
        os.environ.pop(SOCKET_ENV, None)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.process.kill()
        if self.socket_dir.exists():
            for p in self.socket_dir.glob("*"):
                p.unlink(missing_ok=True)
            self.socket_dir.rmdir()


def start_pool(entry_module: str, args: list[str], log_path: Path) -> WarmPool:
    """Start the warm process (``python -m entry_module SOCKET *args``, which calls ``serve_pool``)
    and point this process's environment (which the jobs inherit) at it. The socket lives in a
    private directory (mode 0700) of the temporary folder."""
    import subprocess

    remove_killed_pools_dirs()
    socket_dir = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    path = socket_dir / "pool.sock"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # -P: not the working directory first on sys.path (-m would put it there), so the pool imports
        # the installed package, as the `bertvision` command of a job started on its own does
        cmd = [sys.executable, "-P", "-m", entry_module, str(path), *args]
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    # the pool listens before its imports: the run's first jobs find it (and wait for it)
    deadline = time.monotonic() + BIND_WAIT_SECONDS
    while not path.is_socket() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.environ[SOCKET_ENV] = str(path)
    return WarmPool(process, socket_dir)


def remove_killed_pools_dirs() -> None:
    """Remove this user's socket directories whose pool was killed: a SIGKILL of Snakemake's
    whole process group gives the pool no chance to remove its own. A socket is live while a
    process holds it bound, which Linux lists in /proc/net/unix (read, not connected to: a
    connection would be a request to a live pool); elsewhere nothing is removed."""
    try:
        bound = {
            fields[-1]
            for line in Path("/proc/net/unix").read_text().splitlines()[1:]
            if len(fields := line.split()) > 7
        }
    except OSError:
        return
    for socket_dir in Path(tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}*"):
        path = socket_dir / "pool.sock"
        with contextlib.suppress(OSError):
            if socket_dir.stat().st_uid == os.getuid() and path.is_socket() and str(path) not in bound:
                path.unlink()
                socket_dir.rmdir()
