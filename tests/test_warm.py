"""Warm start: `bertvision` commands forked from a process that imported everything once behave as
commands run on their own: the same output on the same streams, the same exit status, the job's
working directory and environment; a killed or signalled client takes its job with it; an
environment the pool did not import under runs on its own; the pool ends with its parent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from bertvision.commands.warm import start
from bertvision.runtime.warm import SOCKET_ENV, THREAD_VARIABLES
from bertvision.runtime.warm_start import SOCKET_DIR_PREFIX, remove_killed_pools_dirs, start_pool
from tests.conftest import REPO, SHIPPED_GLUE

FORKED = "forked from the warm pool"
BERTVISION = [sys.executable, "-m", "bertvision.commands.launch"]


@pytest.fixture(scope="module")
def pool(tiny_bert, tmp_path_factory):
    log = tmp_path_factory.mktemp("warm") / "warm_pool.log"
    saved = os.environ.get(SOCKET_ENV)
    handle = start([str(tiny_bert)], log)
    socket_path = os.environ[SOCKET_ENV]
    if saved is None:
        os.environ.pop(SOCKET_ENV)
    deadline = time.monotonic() + 180
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert handle.process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the warm pool did not get ready"
        time.sleep(0.2)
    yield handle, socket_path, log
    handle.stop()


def config_file(directory: Path, tiny_bert: Path) -> Path:
    path = directory / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
                "data": {"glue_dir": str(SHIPPED_GLUE)},
                "tasks": {"mrpc": None},
            }
        )
    )
    return path


def run(args, socket_path=None, cwd=None, env=None, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    env.pop(SOCKET_ENV, None)
    if socket_path:
        env[SOCKET_ENV] = socket_path
    return subprocess.run([*BERTVISION, *args], cwd=cwd, env=env, capture_output=True, text=True, **kw)


# a pool whose imports take argv[2] seconds, then succeed ("ready"), fail, or leave a thread running
SLOW_POOL = """
import sys, threading, time
from bertvision.commands.main import main
from bertvision.runtime.warm import serve_pool

def preload():
    time.sleep(float(sys.argv[2]))
    if sys.argv[3] == "fail":
        raise SystemExit("the imports failed")
    if sys.argv[3] == "thread":  # an import that leaves a Python thread running
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()

serve_pool(sys.argv[1], preload, main)
"""


@pytest.fixture
def slow_pool(tmp_path, monkeypatch):
    """Start a pool whose imports take ``seconds`` and end ``how`` ('ready' or 'fail'); its socket and log."""
    (tmp_path / "slow_pool.py").write_text(SLOW_POOL)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the pool and its jobs: the same environment
    handles = []

    def started(seconds: float, how: str):
        handle = start_pool("slow_pool", [str(seconds), how], tmp_path / "pool.log")
        handles.append(handle)
        return os.environ.pop(SOCKET_ENV), tmp_path / "pool.log"

    yield started
    for handle in handles:
        handle.stop()


def test_a_job_that_comes_during_the_imports_waits_for_them_and_is_forked(slow_pool):
    """The pool listens before it imports: the run's first jobs are forked when the imports are
    done, instead of importing the same modules on their own beside them."""
    socket_path, log = slow_pool(3, "ready")
    assert Path(socket_path).is_socket()  # listening when the workflow's start returns
    job = run(["config-keys"], socket_path)
    assert job.returncode == 0 and "heads.training.learning_rate" in job.stdout, job.stderr
    assert FORKED in job.stderr
    assert "ready after 3." in log.read_text()


@pytest.mark.parametrize(
    "seconds, how, logged",
    [
        (2, "fail", "0 jobs forked"),
        # a thread could hold a lock that a forked child would inherit held: every job runs on its own
        (0, "thread", "Python threads after the imports; not forking"),
    ],
    ids=["imports-fail", "imports-leave-a-thread"],
)
def test_jobs_on_a_pool_that_cannot_fork_them_run_on_their_own(slow_pool, seconds, how, logged):
    """A pool whose imports fail, or leave a thread running, forks nothing and removes its socket."""
    socket_path, log = slow_pool(seconds, how)
    job = run(["config-keys"], socket_path)
    assert job.returncode == 0 and "heads.training.learning_rate" in job.stdout, job.stderr
    assert FORKED not in job.stderr
    assert logged in log.read_text() and not Path(socket_path).exists()


def connected(client: subprocess.Popen) -> None:
    """Wait until ``client`` has connected to its pool (and set its relay of signals)."""
    deadline = time.monotonic() + 30
    while not psutil.Process(client.pid).net_connections(kind="unix"):
        assert time.monotonic() < deadline and client.poll() is None, "the client did not connect"
        time.sleep(0.02)
    time.sleep(0.2)


def test_a_signal_to_a_client_waiting_for_the_pools_imports_reaches_its_job(slow_pool):
    """SIGTERM while the pool still imports: kept, and sent to the job once it is forked."""
    socket_path, _ = slow_pool(3, "ready")
    client = subprocess.Popen([*BERTVISION, "config-keys"], env={**os.environ, SOCKET_ENV: socket_path},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    connected(client)
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 128 + signal.SIGTERM, client.stderr.read()


def test_a_signal_to_a_client_whose_pool_then_fails_ends_it_before_it_runs_the_job(slow_pool):
    """SIGTERM while the pool imports, whose imports then fail: the client, about to run the job
    itself, ends by the signal it was sent, as a process on its own would have."""
    socket_path, _ = slow_pool(3, "fail")
    client = subprocess.Popen([*BERTVISION, "config-keys"], env={**os.environ, SOCKET_ENV: socket_path},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    connected(client)
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM
    assert "heads.training.learning_rate" not in client.stdout.read()


def test_a_forked_command_answers_as_one_run_on_its_own(pool, tiny_bert, tmp_path):
    _, socket_path, _ = pool
    config_file(tmp_path, tiny_bert)
    alone = run(["validate-config", "config.yaml", "--show"], cwd=tmp_path)
    warm = run(["validate-config", "config.yaml", "--show"], socket_path, cwd=tmp_path)  # a relative path: its cwd
    assert alone.returncode == warm.returncode == 0
    assert warm.stdout == alone.stdout and "backbones:" in warm.stdout
    assert FORKED in warm.stderr and FORKED not in alone.stderr

    bad = run(["validate-config", "missing.yaml"], socket_path, cwd=tmp_path)
    assert bad.returncode == 2, bad.stderr
    errors = [line for line in bad.stderr.splitlines() if "error:" in line]
    assert errors == [
        "bertvision validate-config: error: missing.yaml: cannot read the config (No such file or directory)"
    ]


def test_a_model_job_runs_forked_with_its_own_environment(pool, tiny_bert, tmp_path):
    """An extraction through the pool writes its shard; the same job with the simulated
    out-of-memory variable set (read when it runs, not at import) fails as out of memory."""
    from bertvision.runtime.device import OUT_OF_MEMORY_EXIT, SIMULATE_OOM_ENV
    from tests.test_device import ATTRS, write_tokens

    _, socket_path, _ = pool
    write_tokens(tmp_path)
    for split in ("selection", "dev"):  # the command extracts every split of the task
        shutil.copy(tmp_path / "tokens" / "train.parquet", tmp_path / "tokens" / f"{split}.parquet")

    def extract(out: str, env=None):
        return run(
            [
                "extract", "--splits", "train", "selection", "dev", "--checkpoint-dir", str(tiny_bert),
                "--tokens-dir", "tokens",
                "--out-dir", out, "--shard", "0", "--n-shards", "1", "--threads", "1",
                "--settings", '{"batch_size": 8, "block_rows": 16, "block_tokens": 65536}',
                "--compute", '{"device": "cpu", "precision": "fp32", "backend": "torch"}', "--attrs", json.dumps(ATTRS),
            ],
            socket_path,
            cwd=tmp_path,
            env=env,
        )  # fmt: skip

    ok = extract("shard-ok")
    assert ok.returncode == 0, ok.stderr
    assert FORKED in ok.stderr and (tmp_path / "shard-ok" / "train.h5").exists()
    oom = extract("shard-oom", env={SIMULATE_OOM_ENV: "4"})
    assert oom.returncode == OUT_OF_MEMORY_EXIT, oom.stderr
    assert FORKED in oom.stderr and "out of memory" in oom.stderr and not (tmp_path / "shard-oom").exists()


def test_an_environment_the_pool_did_not_import_under_runs_on_its_own(pool, tiny_bert, tmp_path, caplog):
    _, socket_path, log = pool
    config_file(tmp_path, tiny_bert)
    proc = run(["validate-config", "config.yaml"], socket_path, cwd=tmp_path, env={"HF_HUB_OFFLINE": "0"})
    assert proc.returncode == 0 and "config.yaml: valid" in proc.stdout
    assert FORKED not in proc.stderr
    assert "environment differs in ['HF_HUB_OFFLINE']" in log.read_text()


def children(pool_process) -> set[int]:
    return {p.pid for p in psutil.Process(pool_process.pid).children()}


def blocked_job(pool, tmp_path) -> tuple[subprocess.Popen, int]:
    """A forked job blocked reading a FIFO nobody writes: (its client, its pid)."""
    handle, socket_path, _ = pool
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    before = children(handle.process)
    env = {**os.environ, SOCKET_ENV: socket_path}
    client = subprocess.Popen([*BERTVISION, "validate-config", str(fifo)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (children(handle.process) - before):
        assert time.monotonic() < deadline, "no job was forked"
        time.sleep(0.05)
    (child,) = children(handle.process) - before
    return client, child


def gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_a_signal_to_the_client_reaches_its_job(pool, tmp_path):
    client, child = blocked_job(pool, tmp_path)
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 128 + signal.SIGTERM
    assert gone(child)


def test_a_killed_client_takes_its_job_with_it(pool, tmp_path):
    client, child = blocked_job(pool, tmp_path)
    client.kill()
    client.wait(timeout=30)
    assert gone(child)


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_the_pool_ends_with_its_parent(tiny_bert, tmp_path):
    """A Snakemake killed without its hooks (SIGKILL) leaves no warm process and no socket
    directory behind."""
    script = (
        "import sys, time; from bertvision.commands.warm import start; "
        f"p = start([], {str(tmp_path / 'pool.log')!r}); "
        "print(p.process.pid, p.socket_dir, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pid, socket_dir = parent.stdout.readline().split()
    pid, socket_dir = int(pid), Path(socket_dir)
    deadline = time.monotonic() + 180
    while "ready" not in ((tmp_path / "pool.log").read_text() if (tmp_path / "pool.log").exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    parent.kill()
    parent.wait()
    assert gone(pid, timeout=20)
    assert not socket_dir.exists()


def test_a_killed_pools_directory_goes_and_a_live_ones_stays(pool):
    """A pool SIGKILLed with Snakemake's whole process group leaves its socket file, which no
    process holds bound any more: the next pool's start removes it, never the socket of a pool
    that is running or the directory of one that has not bound its socket yet."""
    _, live_socket, _ = pool
    killed = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.bind(str(killed / "pool.sock"))
    held.close()  # as a killed process's: the file stays, bound by no one
    starting = Path(tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX))
    try:
        remove_killed_pools_dirs()
        assert not killed.exists()
        assert starting.exists() and Path(live_socket).is_socket()
    finally:
        shutil.rmtree(killed, ignore_errors=True)
        starting.rmdir()


# a pool whose jobs print what their process is: umask, niceness, the BLAS pools' thread counts
PROBE_POOL = """
import json, os, sys
from bertvision.runtime.warm import serve_pool

def preload():
    import numpy  # starts its BLAS pool, one thread per core
    import tempfile
    tempfile.gettempdir()  # cached, as torch's imports leave it
    os.environ["SET_BY_IMPORTS"] = "the pool's"  # as an import may set a variable (a cache folder)

def main(argv):
    if argv[:1] == ["os-exit"]:  # as main does after a disk-full error: no exit status sent
        print("the disk filled up", file=sys.stderr, flush=True)
        os._exit(int(argv[1]))
    if argv[:1] == ["sys-exit"]:
        sys.exit("a message, as argparse's error() or sys.exit(text) leave")
    import tempfile
    from threadpoolctl import threadpool_info
    umask = os.umask(0)
    blas = sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
    where = __import__("bertvision").__file__
    seen = {"pool_only": os.environ.get("POOL_ONLY"), "tmp": tempfile.gettempdir(),
            "set_by_imports": os.environ.get("SET_BY_IMPORTS")}
    print(json.dumps({"umask": umask, "nice": os.nice(0), "blas": blas, "bertvision": where, **seen}))
    return 0

serve_pool(sys.argv[1], preload, main)
"""


@pytest.fixture
def probe_pool(tmp_path, monkeypatch):
    """A pool started from a working directory holding a ``bertvision`` of its own, as a second
    checkout beside the installed one would: its socket."""
    (tmp_path / "probe_pool.py").write_text(PROBE_POOL)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    work = tmp_path / "work"
    (work / "bertvision").mkdir(parents=True)
    (work / "bertvision" / "__init__.py").write_text(
        "raise ImportError('the working directory ran, not the install')\n"
    )
    monkeypatch.chdir(work)
    monkeypatch.setenv("POOL_ONLY", "the pool's")  # in the pool's environment, in no job's
    handle = start_pool("probe_pool", [], tmp_path / "pool.log")
    socket_path = os.environ.pop(SOCKET_ENV)
    deadline = time.monotonic() + 60
    while "ready" not in (tmp_path / "pool.log").read_text():
        assert handle.process.poll() is None, (tmp_path / "pool.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    yield socket_path, work
    handle.stop()


def test_a_forked_job_is_its_own_process_and_the_installs_code(probe_pool):
    """The pool imports the installed package, not the working directory's (python -m would put it
    first on sys.path); a child takes the job's umask, niceness and BLAS thread count."""
    socket_path, work = probe_pool

    def as_a_job():
        os.umask(0o077)
        os.nice(3)

    job_env = {k: v for k, v in os.environ.items() if k != "POOL_ONLY"}
    (work.parent / "job-tmp").mkdir()
    proc = subprocess.run(
        [*BERTVISION, "anything"], env={**job_env, SOCKET_ENV: socket_path, "OPENBLAS_NUM_THREADS": "1",
                                        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                        "TMPDIR": str(work.parent / "job-tmp"), "SET_BY_IMPORTS": "the job's"},
        cwd=work.parent, capture_output=True, text=True, timeout=60, preexec_fn=as_a_job,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # "anything" is no command: only the probe pool's child answers it
    child = json.loads(proc.stdout)
    assert child["umask"] == 0o077 and child["nice"] == os.nice(0) + 3 and child["blas"] == [1], child
    # the job's environment, not the pool's: no variable of the pool's alone, the job's temporary folder
    assert child["pool_only"] is None and child["tmp"] == str(work.parent / "job-tmp"), child
    assert child["set_by_imports"] == "the job's", child  # the job's value over the one the imports set
    stopped = subprocess.run([*BERTVISION, "sys-exit"], env={**job_env, SOCKET_ENV: socket_path}, cwd=work.parent,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert stopped.returncode == 1 and "a message, as argparse" in stopped.stderr, stopped.stderr
    assert Path(child["bertvision"]).parent == REPO / "bertvision"


def test_a_job_that_ends_its_process_itself_exits_with_its_status(probe_pool):
    """A child that ends by os._exit (main does after a disk-full error, whose file HDF5 cannot close)
    sends no exit status: its client exited 1 saying a signal had killed it, the out-of-memory killer
    maybe."""
    socket_path, work = probe_pool
    proc = subprocess.run([*BERTVISION, "os-exit", "2"], env={**os.environ, SOCKET_ENV: socket_path},
                          cwd=work.parent, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "the disk filled up" in proc.stderr and "signal" not in proc.stderr, proc.stderr


def test_a_job_killed_by_a_signal_is_named_by_it(pool, tmp_path):
    """SIGUSR1 ends a process as SIGSEGV does, without the core dump a segfault may take seconds to write."""
    client, child = blocked_job(pool, tmp_path)
    os.kill(child, signal.SIGUSR1)
    assert client.wait(timeout=30) == 128 + signal.SIGUSR1
    assert f"the job's process (pid {child}) was killed by SIGUSR1" in client.stderr.read()


def test_a_job_killed_by_sigkill_is_named_with_the_out_of_memory_killer(pool, tmp_path):
    client, child = blocked_job(pool, tmp_path)
    os.kill(child, signal.SIGKILL)
    assert client.wait(timeout=30) == 128 + signal.SIGKILL
    assert "was killed by SIGKILL (kill -9, or the kernel's out-of-memory killer: see dmesg)" in client.stderr.read()


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_a_job_signalled_as_soon_as_it_is_forked_ends_by_it_and_the_pool_serves_on(pool, tmp_path, signum):
    """Killed before it set itself up (here while it applies the thread counts of its
    environment): the pool's report of the kill used to reach the client before any pid, which
    took it for a refusal and ran the job again itself (blocked on the FIFO, in CI). A SIGTERM
    (the client relays Snakemake's as soon as it knows the pid) ran the pool's own handler
    instead, an exit that unwound the child through the pool's serving loop and hung in the
    interpreter's exit holding its client's connection (in CI). Each ends the job as it ends a
    process, named to the client, the pool serving on."""
    handle, socket_path, _ = pool
    env = {**os.environ, SOCKET_ENV: socket_path, "OMP_NUM_THREADS": "1"}
    for attempt in range(8):
        fifo = tmp_path / f"config{attempt}.fifo"
        os.mkfifo(fifo)
        before = children(handle.process)
        client = subprocess.Popen(
            [*BERTVISION, "validate-config", str(fifo)], env=env, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 30
        while not (forked := children(handle.process) - before):
            assert time.monotonic() < deadline, "no job was forked"
        (child,) = forked
        os.kill(child, signum)
        try:
            assert client.wait(timeout=30) == 128 + signum
        finally:
            client.kill()
        name = signal.Signals(signum).name
        assert f"the job's process (pid {child}) was killed by {name}" in client.stderr.read()
        assert gone(child) and Path(socket_path).exists(), attempt


def test_a_job_after_the_packages_code_changed_runs_it_on_its_own(pool, tiny_bert, tmp_path):
    """An edit mid-run (a pip install, another branch): the pool's imports are the old code."""
    _, socket_path, log = pool
    config_file(tmp_path, tiny_bert)
    module = REPO / "bertvision" / "config" / "validate.py"
    times = module.stat()
    try:
        os.utime(module, ns=(times.st_atime_ns, times.st_mtime_ns + 1_000_000_000))
        proc = run(["validate-config", "config.yaml"], socket_path, cwd=tmp_path)
    finally:
        os.utime(module, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert proc.returncode == 0 and FORKED not in proc.stderr, proc.stderr
    assert "runs a job on its own, bertvision's code changed since the pool imported it" in log.read_text()
    again = run(["validate-config", "config.yaml"], socket_path, cwd=tmp_path)
    assert again.returncode == 0 and FORKED in again.stderr  # as it was: forked again


# a pool that imports torch and numpy before it forks, as the workflow's does; its jobs print the
# thread counts they run with, their niceness, the size of the BIG_ variables of their environment
# and the variable the pool's imports set
THREADS_POOL = """
import json, os, signal, sys, time
from bertvision.runtime.warm import serve_pool

def preload():
    import numpy, torch  # noqa: F401  each sizes its thread pool for the pool's environment
    os.environ["SET_BY_IMPORTS"] = "the pool's"  # as torch's sets TORCHINDUCTOR_CACHE_DIR

def main(argv):
    if argv[:1] == ["sys-exit"]:  # as argparse's --help (0) or a bare sys.exit() (None) end
        sys.exit(int(argv[1]) if argv[1:] else None)
    if argv[:1] == ["trap-term"]:  # a job that ends its own way on SIGTERM
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))
        print("trapped", flush=True)
        time.sleep(60)
    import torch
    from threadpoolctl import threadpool_info
    blas = sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
    big = sum(len(v) for k, v in os.environ.items() if k.startswith("BIG_"))
    seen = {"nice": os.nice(0), "set_by_imports": os.environ.get("SET_BY_IMPORTS")}
    print(json.dumps({"torch": torch.get_num_threads(), "blas": blas, "big": big, **seen}))
    return 0

serve_pool(sys.argv[1], preload, main)
"""


@pytest.fixture(scope="module")
def threads_pool(tmp_path_factory):
    """A pool started with no thread count in its environment: its socket, and the job environment that matches it."""
    tmp_path = tmp_path_factory.mktemp("threads-pool")
    (tmp_path / "threads_pool.py").write_text(THREADS_POOL)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(tmp_path))
        for variable in THREAD_VARIABLES:
            patch.delenv(variable, raising=False)
        handle = start_pool("threads_pool", [], tmp_path / "pool.log")
        socket_path = os.environ.pop(SOCKET_ENV)
        env = dict(os.environ)
    deadline = time.monotonic() + 120
    while "ready" not in (tmp_path / "pool.log").read_text():
        assert handle.process.poll() is None, (tmp_path / "pool.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    yield socket_path, {**env, SOCKET_ENV: socket_path}
    handle.stop()


def test_a_forked_job_computes_with_the_thread_counts_of_its_environment(threads_pool):
    """torch's and the BLAS pools were sized by the pool's imports; a job's OMP_NUM_THREADS sets
    torch's, and its BLAS pools take the most specific variable, as OpenBLAS does in a fresh process."""
    _, env = threads_pool

    def job(**variables) -> dict:
        proc = subprocess.run([*BERTVISION, "anything"], env={**env, **variables}, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    pools = job()["torch"]  # the pool's own count, which a job that sets none keeps
    asked = job(OMP_NUM_THREADS=str(pools + 1), OPENBLAS_NUM_THREADS="1")
    assert asked["torch"] == pools + 1 and asked["blas"] == [1], asked


def test_a_job_with_an_environment_larger_than_one_read_is_forked_with_it_whole(threads_pool):
    """The request (the job's environment) comes in several reads past 64 KiB: the pool reads all of it."""
    _, env = threads_pool
    big = {f"BIG_{i}": "x" * 50_000 for i in range(4)}  # one variable holds 128 KiB at most
    for _ in range(2):  # and the pool serves on
        proc = subprocess.run([*BERTVISION, "anything"], env={**env, **big}, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0 and json.loads(proc.stdout)["big"] == 200_000, proc.stderr


def test_a_server_and_the_commands_own_options_run_in_their_own_process(threads_pool):
    """`bertvision serve` keeps running, and `bertvision --version` or `--help` is no job: none is forked."""
    _, env = threads_pool
    version = subprocess.run([*BERTVISION, "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("bertvision "), (version.stdout, version.stderr)
    serve = subprocess.run([*BERTVISION, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert serve.returncode == 2 and "the following arguments are required: bundles" in serve.stderr, serve.stderr


def test_a_forked_job_that_exits_successfully_exits_0(threads_pool):
    """sys.exit() and SystemExit(0) (argparse's --help) are a success, as in a process of its own."""
    _, env = threads_pool
    for argv, code in ((["sys-exit"], 0), (["sys-exit", "0"], 0), (["sys-exit", "4"], 4)):
        proc = subprocess.run([*BERTVISION, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, (argv, proc.stderr)


def test_a_job_that_handles_a_relayed_signal_exits_with_its_own_status(threads_pool):
    """The client passes SIGTERM on; a job that catches it and exits 5 exits 5, as on its own."""
    _, env = threads_pool
    client = subprocess.Popen([*BERTVISION, "trap-term"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert client.stdout.readline() == "trapped\n"
        client.send_signal(signal.SIGTERM)
        assert client.wait(timeout=30) == 5, client.stderr.read()
    finally:
        client.kill()


def test_a_request_without_the_jobs_three_standard_streams_is_refused(threads_pool):
    """A client that passes no descriptors gets no job: the pool closes its connection and serves on."""
    socket_path, env = threads_pool
    request = json.dumps({"argv": ["anything"], "cwd": os.getcwd(), "env": env, "process": {}}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(socket_path)
        conn.sendall(struct.pack("!I", len(request)) + request)
        assert conn.makefile("r").readline() == ""
    proc = subprocess.run([*BERTVISION, "anything"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["big"] == 0, proc.stderr


def test_a_forked_job_keeps_what_the_imports_set_and_its_own_niceness_one_step_lower(threads_pool):
    """A variable the pool's imports set, which the job's environment lacks, is kept (torch's cache
    folder); a job started one step nicer than the pool runs one step nicer."""
    _, env = threads_pool
    proc = subprocess.run([*BERTVISION, "anything"], env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.nice(1))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout)
    assert child["set_by_imports"] == "the pool's" and child["nice"] == os.nice(0) + 1, child
