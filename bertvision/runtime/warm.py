"""Warm start for local jobs: one process imports torch, transformers and the stages once, and
every `bertvision` command of a local Snakemake run is forked from it instead of starting a new
interpreter.

Why by hand: a model job spends 4-6 s importing torch and transformers (5 s idle on the 2-core
CPU this project is measured on, more under load; transformers 5 pulls torch._dynamo and
torch.distributed.tensor in when it loads a model), and the default run has about 70 of them: a
quarter of its job-seconds. No library forks preloaded Python processes for Snakemake's shell
jobs; the pieces here are the standard ones (a Unix socket, SCM_RIGHTS to pass the job's stdin,
stdout and stderr, fork).

- ``serve_pool(socket_path, preload, main)``: the warm process (``python -m bertvision.commands.warm``,
  which names what to import and the command line's ``main``). It listens, imports everything,
  then answers (a job that comes sooner waits for the imports); per connection it checks the
  peer is this user, and forks: the child takes the job's standard streams, working directory
  and environment and runs ``main``; the client gets the child's pid, then its exit status. It
  never runs a tensor operation itself (torch's thread pool does not exist when it forks; the
  idle BLAS and allocator threads that numpy, scipy and pyarrow start have fork handlers, as
  multiprocessing's fork relies on too) and exits when its parent (Snakemake) is gone.
- ``run_in_pool(argv)``: what the `bertvision` command does first (``commands.launch``): with
  ``BERTVISION_WARM_SOCKET`` set and the pool answering, the command runs in a forked child and
  this process relays signals and the exit status; otherwise (no pool, a pool that ended, or an
  environment the pool was not started with) it returns None and the command runs here.
- ``runtime.warm_start``: the pool started and stopped by the Snakefile's onstart/onsuccess/onerror
  hooks (through ``commands.warm.start``).

What a job loses under the pool: Snakemake's benchmark file measures the client process, so its
``max_rss`` and ``cpu_time`` are the client's (wall seconds are right); the child's peak memory
and CPU seconds are the usage line every command ends its log with (``runtime.usage``), which
the reports read. Cluster jobs never use the pool.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

SOCKET_ENV = "BERTVISION_WARM_SOCKET"
# Environment variables read when modules are imported: a job whose values differ from the
# pool's runs on its own, since the pool's imports saw other values.
IMPORT_TIME_PREFIXES = (
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "CUDA_",
    "NCCL_",
    "TOKENIZERS_",
    "PYTHON",
    "LD_",
    "MALLOC_",
    "GLIBC_",
)
# Thread counts Snakemake sets per job: applied in the child (torch's pool is created there; the
# BLAS pools numpy started in the pool are limited to it through threadpoolctl).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
# Commands that keep running (a server) or are the pool itself stay in their own process.
OWN_PROCESS_COMMANDS = ("serve", "warm-pool")
_HEADER = struct.Struct("!I")


RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a client passes these on to its job


def _import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in THREAD_VARIABLES}


# --- the client: the `bertvision` command --------------------------------------------------------
def run_in_pool(argv: list[str]) -> int | None:
    """Run ``bertvision argv`` in a child of the warm pool; its exit status, or None when no
    pool takes it (the caller then runs the command itself)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or not argv or argv[0] in OWN_PROCESS_COMMANDS or argv[0].startswith("-"):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as err:  # no pool, or one that has ended
        conn.close()
        print(
            f"bertvision: the warm pool does not answer ({err.strerror}); this job starts on its own", file=sys.stderr
        )
        return None
    umask = os.umask(0)
    os.umask(umask)
    process = {"umask": umask, "nice": os.nice(0)}
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "process": process}).encode()
    message = _HEADER.pack(len(request)) + request
    job = {"pid": None, "signals": []}

    def relay(signum, _frame):  # to the job once its pid is known; until then, kept
        job["signals"].append(signum)
        if job["pid"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job["pid"], signum)

    previous = {signum: signal.signal(signum, relay) for signum in RELAYED_SIGNALS}
    with conn:
        try:
            sent = socket.send_fds(conn, [message], [0, 1, 2])
            if sent < len(message):
                conn.sendall(message[sent:])
            replies = conn.makefile("r")
            first = json.loads(replies.readline() or "{}")
        except (OSError, ValueError):
            first = {}
        if "pid" not in first:  # the pool went away or refused: run here, as if it never answered
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for signum in job["signals"]:
                os.kill(os.getpid(), signum)
            return None
        job["pid"] = first["pid"]
        for signum in job["signals"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job["pid"], signum)
        last = replies.readline()
    ended = json.loads(last) if last else {}
    if "exit" in ended:
        return int(ended["exit"])
    if job["signals"]:
        return 128 + job["signals"][-1]
    killed = ended.get("signal")
    name = signal.Signals(killed).name if killed else "a signal"
    why = " (kill -9, or the kernel's out-of-memory killer: see dmesg)" if killed in (None, signal.SIGKILL) else ""
    print(f"bertvision: the job's process (pid {job['pid']}) was killed by {name}{why}", file=sys.stderr)
    return 128 + killed if killed else 1


# --- the warm process ----------------------------------------------------------------------------
def serve_pool(socket_path: str, preload: Callable[[], None], main: Callable[[list[str]], int]) -> None:
    """Listen, ``preload()``, then fork one child per request, which runs ``main(argv)``, until the
    parent process is gone or SIGTERM. A job that comes during the imports waits in the listen
    backlog: started on its own, it would import the same modules beside them on the same cores
    (a run's first jobs, its downloads and tokenizations, did: the pool was ready after 12 s, not 8)."""
    import gc

    parent = os.getppid()
    t0 = time.perf_counter()
    started_with = dict(os.environ)
    code = code_fingerprint()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    forked = 0
    try:
        preload()
        # what the imports set themselves (torch sets TORCHINDUCTOR_CACHE_DIR): kept in the children
        set_by_imports = {k: v for k, v in os.environ.items() if k not in started_with}
        if threading.active_count() > 1:  # a Python thread could hold a lock the children would inherit
            print(
                f"warm pool: {threading.active_count()} Python threads after the imports; not forking",
                file=sys.stderr,
            )
            return
        gc.collect()
        gc.freeze()  # the children's garbage collection then leaves the shared pages alone
        own_env = _import_time_env(started_with)
        listener.settimeout(2.0)
        signal.signal(signal.SIGCHLD, _reap)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(
            f"warm pool: ready after {time.perf_counter() - t0:.1f} s, pid {os.getpid()}", file=sys.stderr, flush=True
        )
        while os.getppid() == parent:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                forked += _answer(conn, listener, own_env, set_by_imports, main, code)
    finally:
        # the jobs still waiting in the backlog read the end of their connection and run on their own
        listener.close()
        # the socket's private directory is this process's: a Snakemake stopped without its hooks
        # (Ctrl-C, SIGKILL) must not leave it in the temporary folder
        Path(socket_path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            Path(socket_path).parent.rmdir()
        print(f"warm pool: {forked} jobs forked; exiting", file=sys.stderr, flush=True)


# each running child's connection to its client, over which a child that sent no exit status (a
# signal killed it, or it ended by os._exit) is reported by the pool; a second report after the
# child's own is never read (its client reads one)
_CHILDREN: dict[int, socket.socket] = {}


def _reap(_signum, _frame) -> None:
    try:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                return
            conn = _CHILDREN.pop(pid, None)
            if conn is not None:
                ended = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.WEXITSTATUS(status)}
                with conn, contextlib.suppress(OSError):
                    conn.sendall((json.dumps(ended) + "\n").encode())
    except ChildProcessError:
        pass


def code_fingerprint() -> tuple:
    """The size and time of every module of the bertvision package this process imported from:
    a job started after one of them changed (an edit, a `pip install`, another branch) must run
    the code as it is now, which a fork of the pool's imports would not."""
    package = Path(__file__).resolve().parents[1]
    return tuple(sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in package.rglob("*.py")))


def _answer(
    conn: socket.socket, listener: socket.socket, own_env: dict, set_by_imports: dict, main, code: tuple
) -> int:
    """Read one request and fork its child; 1 if a child was forked."""
    fds: list[int] = []
    try:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if uid != os.getuid() or len(fds) != 3 or len(data) < _HEADER.size:
            print(f"warm pool: refused a request (uid {uid}, {len(fds)} descriptors)", file=sys.stderr, flush=True)
            return 0
        size = _HEADER.unpack_from(data)[0]
        while len(data) < _HEADER.size + size:
            more = conn.recv(1 << 16)
            if not more:
                return 0
            data += more
        request = json.loads(data[_HEADER.size : _HEADER.size + size])
        differs = sorted(
            k for k in set(own_env) | set(_import_time_env(request["env"])) if own_env.get(k) != request["env"].get(k)
        )
        why = f"its environment differs in {differs}" if differs else None
        if not why and code_fingerprint() != code:
            why = "bertvision's code changed since the pool imported it"
        if why:
            print(f"warm pool: runs a job on its own, {why}", file=sys.stderr, flush=True)
            conn.sendall((json.dumps({"refused": why}) + "\n").encode())
            return 0
        # SIGCHLD held until the child's pid is sent and its connection kept: a child that a signal
        # kills at once is reported after its pid, never instead of it (the client would take a
        # report with no pid for a refusal and run the job again itself). The child waits for the
        # pid to be sent, so that its own exit status comes after it too. The relayed signals are
        # held over the fork as well: one that reached the child before it dropped the pool's
        # handlers ran them (SIGTERM's exit unwound the child through this loop, which removed the
        # pool's socket, or hung in the interpreter's exit holding its client's connection).
        held = {signal.SIGCHLD, *RELAYED_SIGNALS}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        pid_sent, may_start = os.pipe()
        try:
            pid = os.fork()
            if pid == 0:  # the child never returns from here
                try:
                    for signum in held:
                        signal.signal(signum, signal.SIG_DFL)
                    # a signal sent to it already acts now, as on any process
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
                    os.close(may_start)
                    os.read(pid_sent, 1)
                    os.close(pid_sent)
                except BaseException:  # noqa: BLE001 - nothing of the child may return into the pool's loop
                    os._exit(1)
                _run_child(conn, listener, fds, request, set_by_imports, main)
            with contextlib.suppress(OSError):  # a client gone: its job ends on the closed connection
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
            _CHILDREN[pid] = conn.dup()  # kept until the child is reaped
        finally:
            os.close(pid_sent)
            os.close(may_start)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        return 1
    finally:
        for fd in fds:
            os.close(fd)


def _run_child(
    conn: socket.socket, listener: socket.socket, fds: list[int], request: dict, set_by_imports: dict, main
) -> None:
    code = 1
    try:
        listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"]})
        tempfile.tempdir = None  # read TMPDIR again
        _as_the_jobs_process(request.get("process") or {})
        sys.argv = ["bertvision", *request["argv"]]
        # the client gone (killed): so is the job
        threading.Thread(target=_exit_when_closed, args=(conn,), daemon=True).start()
        code = _exit_code(main, request["argv"])
    except BaseException:  # noqa: BLE001 - the child must always report and exit
        import traceback

        traceback.print_exc()
    finally:
        try:
            logging.getLogger("bertvision.runtime.warm").info("forked from the warm pool")
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall((json.dumps({"exit": code}) + "\n").encode())
        finally:
            os._exit(code)


def _as_the_jobs_process(process: dict) -> None:
    """The child as a fresh process of the job would start: its umask and niceness, and the
    thread counts of its environment for torch and for the BLAS pools the pool's imports started."""
    if "umask" in process:
        os.umask(process["umask"])
    if process.get("nice", 0) > os.nice(0):  # lowered only: raising it again needs privileges
        os.nice(process["nice"] - os.nice(0))
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    blas = next((os.environ[v] for v in THREAD_VARIABLES[::-1] if os.environ.get(v, "").isdigit()), None)
    if blas is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(int(blas), user_api="blas")


def _exit_code(main, argv: list[str]) -> int:
    try:
        return int(main(argv) or 0)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return int(stop.code or 0)
        print(stop.code, file=sys.stderr)
        return 1


def _exit_when_closed(conn: socket.socket) -> None:
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    os._exit(1)
