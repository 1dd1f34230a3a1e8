"""PyTorch against ONNX Runtime (fp32 and int8 weights) for every encoder pass a user waits on,
each backend on the same rows in the same run, after a finished default run (``make run``):

1. the raw forward (every hidden state) of the default backbone over SST-2 dev sentences in
   batches of 32: sequences per second, and the largest difference of any real token's state
   from PyTorch's;
2. the extraction stage itself (``extract_shard``) on the run's SST-2 tokens, every split:
   sequences per second, and the largest difference of the stored [CLS] and mean states;
3. the service (``bertvision serve --backend``) on the run's picked bundles at ``--concurrency``
   clients, each request a distinct SST-2 dev sentence and STS-B dev pair: requests per second;
4. the served dev scores of each task's picked head through each backend (the pipeline's own
   are PyTorch's);
5. four settings of ONNX Runtime's int8 quantizer: each sentence's mean-pooled last-layer state's
   cosine to fp32's, and their speed (why the shipped int8 is per channel, 7 bits).

Ratios are against PyTorch in the same run. Markdown goes to stdout.

    python scripts/benchmark_onnx.py [--run-dir .] [--seconds 20] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from benchmark_serve import load_level, start_server

from bertvision.config.schema import validate_config
from bertvision.config.settings import ExtractCompute
from bertvision.config.workflow import WorkflowSettings
from bertvision.features.store import read_shard
from bertvision.layout import PICKED_BUNDLES_DIR, RAW_DIR, TOKENS_DIR, Checkpoint, Run, shard_file, split_file
from bertvision.models.backbone import resolve_pretrained
from bertvision.models.encoder_io import load_encoder
from bertvision.registry.tasks import get_task
from bertvision.runtime.backend import with_backend
from bertvision.script_support import run_script
from bertvision.serving.bundle import bundle_paths, load_bundle
from bertvision.serving.engine import Engine
from bertvision.serving.items import TextItem
from bertvision.stages.extract import extract_shard

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("torch", "onnx", "onnx-int8")  # auto is one of these, measured


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def sentence_batches(backbone: str, sentences: list[str]) -> tuple[str, list[dict]]:
    """The backbone's local folder and ``sentences`` tokenized in padded batches of 32."""
    from transformers import AutoTokenizer

    source = str(resolve_pretrained(backbone))
    tokenizer = AutoTokenizer.from_pretrained(source)
    return source, [
        tokenizer(sentences[i : i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt")
        for i in range(0, len(sentences), 32)
    ]


def raw_forward(backbone: str, sentences: list[str], repeats: int, threads: int) -> list[dict]:
    source, batches = sentence_batches(backbone, sentences)
    torch_model = load_encoder(source).eval()
    models = {backend: with_backend(torch_model, backend, threads) for backend in BACKENDS}

    def run(model):
        with torch.inference_mode():
            return [model(**batch, output_hidden_states=True).hidden_states for batch in batches]

    reference = run(torch_model)
    seconds = {backend: [] for backend in BACKENDS}
    for _ in range(repeats):  # interleaved, so that a slow spell of the machine hits every backend
        for backend, model in models.items():
            t0 = time.perf_counter()
            states = run(model)
            seconds[backend].append(time.perf_counter() - t0)
    rows = []
    for backend, model in models.items():
        states = run(model)
        worst = max(
            float((a[batch["attention_mask"].bool()] - b[batch["attention_mask"].bool()]).abs().max())
            for ref, got, batch in zip(reference, states, batches)
            for a, b in zip(ref, got)
        )
        rows.append({"backend": backend, "seq_s": len(sentences) / np.median(seconds[backend]), "max_diff": worst})
    return rows


def pooled_last_layer(runner, batches: list[dict]) -> torch.Tensor:
    """Each sentence's last-layer state averaged over its real tokens, from ``runner`` (a model or
    an ``OnnxEncoder``)."""
    with torch.inference_mode():
        out = []
        for batch in batches:
            last = runner(**batch, output_hidden_states=True).hidden_states[-1]
            mask = batch["attention_mask"][..., None].float()
            out.append((last * mask).sum(1) / mask.sum(1))
        return torch.cat(out)


def quantization_fidelity(backbone: str, sentences: list[str], threads: int) -> list[dict]:
    """Four dynamic int8 settings of ONNX Runtime's quantizer against the fp32 export: each
    sentence's mean-pooled last-layer state's cosine to fp32's, and sequences per second."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertvision.models.onnx_encoder import OnnxEncoder, exported

    source, batches = sentence_batches(backbone, sentences)
    model = load_encoder(source).eval()
    fp32 = exported(model, "onnx")
    settings = {
        "per tensor, 8 bits (the quantizer's default)": {},
        "per channel, 8 bits": {"per_channel": True},
        "per channel, 7 bits (shipped)": {"per_channel": True, "reduce_range": True},
        "per tensor, unsigned": {"weight_type": QuantType.QUInt8},
    }

    reference = pooled_last_layer(with_backend(model, "onnx", threads), batches)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, options in settings.items():
            path = Path(scratch) / f"{len(rows)}.onnx"
            quantize_dynamic(str(fp32), str(path), **{"weight_type": QuantType.QInt8, **options})
            runner = OnnxEncoder(model, "onnx-int8", threads)
            runner.session = ort.InferenceSession(str(path), runner.session.get_session_options(),
                                                  providers=["CPUExecutionProvider"])  # fmt: skip
            t0 = time.perf_counter()
            got = pooled_last_layer(runner, batches)
            seconds = time.perf_counter() - t0
            cosines = torch.nn.functional.cosine_similarity(reference, got)
            rows.append({"setting": name, "mean": float(cosines.mean()), "min": float(cosines.min()),
                         "seq_s": len(sentences) / seconds})  # fmt: skip
    return rows


def export_attention(backbone: str, sentences: list[str], repeats: int, threads: int) -> list[dict]:
    """The export traced with each of PyTorch's attentions (``onnx_encoder.EXPORT_ATTENTION``), in
    fp32 and int8: sequences per second, interleaved as in ``raw_forward``, and each sentence's
    mean-pooled last-layer state's cosine to PyTorch's."""
    import onnxruntime as ort

    from bertvision.models import onnx_encoder

    source, batches = sentence_batches(backbone, sentences)
    model = load_encoder(source).eval()

    reference = pooled_last_layer(model, batches)
    shipped = onnx_encoder.EXPORT_ATTENTION
    runners = {}
    with tempfile.TemporaryDirectory() as scratch:
        for attention in ("sdpa", "eager"):
            onnx_encoder.EXPORT_ATTENTION = attention
            fp32 = onnx_encoder.export(model, Path(scratch) / f"{attention}.onnx")
            int8 = onnx_encoder.quantize(fp32, Path(scratch) / f"{attention}-int8.onnx")
            for backend, path in (("onnx", fp32), ("onnx-int8", int8)):
                runner = onnx_encoder.OnnxEncoder(model, backend, threads)
                runner.session = ort.InferenceSession(str(path), runner.session.get_session_options(),
                                                      providers=["CPUExecutionProvider"])  # fmt: skip
                runners[f"{backend}, {attention}{' (shipped)' if attention == shipped else ''}"] = runner
        onnx_encoder.EXPORT_ATTENTION = shipped
        seconds = {name: [] for name in runners}
        for _ in range(repeats):
            for name, runner in runners.items():
                t0 = time.perf_counter()
                pooled_last_layer(runner, batches)
                seconds[name].append(time.perf_counter() - t0)
        rows = []
        for name, runner in runners.items():
            cosines = torch.nn.functional.cosine_similarity(reference, pooled_last_layer(runner, batches))
            rows.append({"export": name, "seq_s": len(sentences) / np.median(seconds[name]),
                         "mean": float(cosines.mean()), "min": float(cosines.min())})  # fmt: skip
    return rows


def extraction(run_dir: Path, config: dict, threads: int) -> list[dict]:
    settings = WorkflowSettings(validate_config(config, source="config.yaml"), source="config.yaml")
    task = "sst2"
    run = Run(next(iter(config["backbones"])), task, 1, Checkpoint(0))
    tokens = run_dir / run.format(TOKENS_DIR)
    backbone = str(resolve_pretrained(config["backbones"][run.model]["pretrained"]))
    splits = ["train", "selection", "dev"]
    rows, stored = [], {}
    scratch = Path(tempfile.mkdtemp(prefix="bv-onnx-extract-"))
    try:
        for backend in BACKENDS:
            compute = ExtractCompute(device="cpu", precision="fp32", backend=backend)
            with_backend(load_encoder(backbone).eval(), backend)  # export outside the timing (cached)
            out = scratch / backend
            t0 = time.perf_counter()
            extract_shard(
                Path(backbone), tokens, out, 0, 1, splits, settings.extract(), compute,
                settings.extract_attrs(run), threads=threads,
            )  # fmt: skip
            seconds = time.perf_counter() - t0
            n = sum(len(pd.read_parquet(split_file(tokens, s), columns=[])) for s in splits)
            stored[backend] = {}
            rows.append({"backend": backend, "sequences": n, "seconds": seconds, "seq_s": n / seconds})
            for reads in ("cls", "mean"):
                stored[backend][reads] = np.concatenate(
                    [read_shard(shard_file(out, s), reads)[0].astype(np.float32) for s in splits]
                )
        for row in rows:
            row["max_diff"] = max(
                float(np.abs(stored[row["backend"]][r] - stored["torch"][r]).max()) for r in ("cls", "mean")
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def dev_items(run_dir: Path, task_name: str) -> tuple[list[tuple], np.ndarray]:
    """A task's dev rows in a run: each row's texts, and the labels."""
    task = get_task(task_name)
    dev = pd.read_parquet(split_file(run_dir / RAW_DIR.format(task=task_name), "dev"))
    return [tuple(str(row[f]) for f in task.text_fields) for _, row in dev.iterrows()], dev["label"].to_numpy()


def served_scores(bundles: Path, run_dir: Path, threads: int) -> list[dict]:
    rows = []
    for backend in BACKENDS:
        row = {"backend": backend}
        for path in bundle_paths([bundles]):
            engine = Engine(load_bundle(path), "cpu", threads=threads, backend=backend)
            for name, entry in engine.tasks.items():
                texts, labels = dev_items(run_dir, name)
                results = []
                for start in range(0, len(texts), 64):
                    items = [TextItem(t, {name: entry.picked}) for t in texts[start : start + 64]]
                    results += [answers[name] for answers in engine.predict(items)[0]]
                if get_task(name).kind == "regression":
                    row[name] = float(np.corrcoef([r.score for r in results], labels)[0, 1])
                else:
                    names = list(get_task(name).label_names)
                    row[name] = float(np.mean([names.index(r.label) == y for r, y in zip(results, labels)]))
        rows.append(row)
    return rows


# the service as it was before batches went through in length-sorted chunks (ServeSettings)
ONE_CALL_PER_BATCH = ("--max-chunk-rows", "0", "--pad-multiple", "32")


def served_rate(bundles: Path, run_dir: Path, args, *flags: str) -> dict:
    """Requests per second at ``args.concurrency`` clients, each request a distinct SST-2 dev
    sentence and STS-B dev pair, from a server started with ``flags``."""
    sentences, _ = dev_items(run_dir, "sst2")
    pairs, _ = dev_items(run_dir, "stsb")
    bodies = [{"texts": [s[0], list(p)]} for s, p in zip(sentences, pairs)]
    proc, url = start_server(bundles, 1, args, "--device", "cpu", *flags)
    try:
        return asyncio.run(load_level(url, bodies, args.concurrency, 10**9, args.seconds))
    finally:
        proc.terminate()
        proc.wait()


def service(bundles: Path, run_dir: Path, args) -> list[dict]:
    """Each backend with the service's defaults, and PyTorch as it served before (the baseline)."""
    before = {
        "backend": "torch, one call per batch (before)",
        **served_rate(bundles, run_dir, args, *ONE_CALL_PER_BATCH),
    }
    return [before] + [
        {"backend": backend, **served_rate(bundles, run_dir, args, "--backend", backend)} for backend in BACKENDS
    ]


def chunk_settings(bundles: Path, run_dir: Path, args) -> list[dict]:
    """The service's requests per second over rows per forward call x width multiple, per backend."""
    grid = [(0, 32), (32, 32), (16, 32), (16, 16), (16, 8), (8, 8)]
    return [
        {"backend": backend, "rows": rows, "multiple": multiple,
         **served_rate(bundles, run_dir, args, "--backend", backend, "--max-chunk-rows", str(rows),
                       "--pad-multiple", str(multiple))}
        for backend in ("torch", "onnx-int8")
        for rows, multiple in grid
    ]  # fmt: skip


def ratio_table(rows: list[dict], key: str, unit: str, extra: str | None = None) -> list[str]:
    base = next(r[key] for r in rows if r["backend"] == "torch")
    head = f"| backend | {unit} | vs torch |" + (f" {extra} |" if extra else "")
    lines = [head, "|---|---|---|" + ("---|" if extra else "")]
    for r in rows:
        cell = f" {r['max_diff']:.2g} |" if extra else ""
        lines.append(f"| {r['backend']} | {r[key]:.1f} | {r[key] / base:.2f}x |{cell}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path, default=REPO, help="a finished default run (make run)")
    p.add_argument("--rows", type=int, default=512, help="SST-2 dev sentences of the raw forward")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of load per backend")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    parts = ("forward", "extraction", "service", "scores", "fidelity", "attention", "chunks")
    p.add_argument("--parts", nargs="+", choices=parts, default=parts, help="what to measure (default: all)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    bundles = args.run_dir / PICKED_BUNDLES_DIR.format(model=next(iter(config["backbones"])))
    sentences, _ = dev_items(args.run_dir, "sst2")
    backbone = config["backbones"][next(iter(config["backbones"]))]["pretrained"]

    if "forward" in args.parts:
        forward = raw_forward(backbone, [s[0] for s in sentences[: args.rows]], args.repeats, args.threads)
    if "extraction" in args.parts:
        extracted = extraction(args.run_dir, config, args.threads)
    if "service" in args.parts:
        served = service(bundles, args.run_dir, args)
    if "scores" in args.parts:
        scores = served_scores(bundles, args.run_dir, args.threads)
    if "fidelity" in args.parts:
        fidelity = quantization_fidelity(backbone, [s[0] for s in sentences[:256]], args.threads)
    if "chunks" in args.parts:
        chunks = chunk_settings(bundles, args.run_dir, args)
    if "attention" in args.parts:
        attention = export_attention(backbone, [s[0] for s in sentences[: args.rows]], args.repeats, args.threads)

    import onnxruntime

    versions = f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, python {sys.version.split()[0]}"
    print(
        f"# ONNX Runtime against PyTorch\n\n{cpu_name()}, {os.cpu_count()} cores, {args.threads} threads; {versions}\n"
    )
    if "forward" in args.parts:
        print(f"## 1. Raw forward: {args.rows} SST-2 dev sentences, batches of 32, median of {args.repeats}\n")
        print("\n".join(ratio_table(forward, "seq_s", "sequences/s", "largest real-token state difference")))
    if "extraction" in args.parts:
        print("\n## 2. Extraction (`extract_shard`), the run's SST-2 tokens, every split, one shard\n")
        print("\n".join(ratio_table(extracted, "seq_s", "sequences/s", "largest stored-state difference")))
    if "service" in args.parts:
        print(f"\n## 3. The service at {args.concurrency} clients, {args.seconds:g} s each, one worker\n")
        print("Each request: a distinct SST-2 dev sentence and STS-B dev pair, both tasks answered. The first row:")
        print(f"PyTorch with `{' '.join(ONE_CALL_PER_BATCH)}`, the service before length-sorted chunks.\n")
        torch_rate, before_rate = served[1]["rps"], served[0]["rps"]
        print("| backend | requests/s | vs torch | vs before |\n|---|---|---|---|")
        for r in served:
            print(f"| {r['backend']} | {r['rps']:.1f} | {r['rps'] / torch_rate:.2f}x | {r['rps'] / before_rate:.2f}x |")
    if "scores" in args.parts:
        print("\n## 4. Served dev scores of each task's picked head\n")
        tasks = [k for k in scores[0] if k != "backend"]
        print("| backend | " + " | ".join(tasks) + " |\n|---|" + "---|" * len(tasks))
        for r in scores:
            print(f"| {r['backend']} | " + " | ".join(f"{r[t]:.4f}" for t in tasks) + " |")

    if "fidelity" in args.parts:
        print("\n## 5. int8 settings: 256 SST-2 dev sentences, mean-pooled last layer against fp32's\n")
        print("| quantization | mean cosine | least cosine | sequences/s (one timing) |\n|---|---|---|---|")
        for r in fidelity:
            print(f"| {r['setting']} | {r['mean']:.4f} | {r['min']:.4f} | {r['seq_s']:.0f} |")

    if "attention" in args.parts:
        print(f"\n## 6. The attention the export traces: {args.rows} SST-2 dev sentences, median of {args.repeats}\n")
        print("| export | sequences/s | mean cosine to PyTorch's | least cosine |\n|---|---|---|---|")
        for r in attention:
            print(f"| {r['export']} | {r['seq_s']:.1f} | {r['mean']:.4f} | {r['min']:.4f} |")

    if "chunks" in args.parts:
        print(f"\n## 7. The service's forward calls: rows per call x width multiple, {args.seconds:g} s each\n")
        print("| backend | --max-chunk-rows | --pad-multiple | requests/s | vs the first row |\n|---|---|---|---|---|")
        for r in chunks:
            ratio = r["rps"] / chunks[0]["rps"]
            print(f"| {r['backend']} | {r['rows']} | {r['multiple']} | {r['rps']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    run_script(main)
