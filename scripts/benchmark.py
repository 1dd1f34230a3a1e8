"""Measure, in one run on this machine, the pipeline's efficiency ratios for a backbone:

1. extraction time / plain forward time over the same batches        (goal <= 1.10)
2. share of head-training wall time spent waiting for data           (goal <= 5%)
3. feature bytes on disk / minimum (examples x layers x the widths of every kind of state the
   shards hold ([CLS], token mean) x 2, or tokens x layers x hidden x 2 for span tasks)
                                                                      (goal <= 1.05)
4. padded tokens / real tokens in fine-tuning and in extraction       (goal <= 1.15)
5. stored vs streamed (store: false) head training, side by side: bytes on disk, extraction
   seconds, head-training seconds, seconds per head-epoch and the data-wait share
6. extraction throughput of the frozen forward pass (sequences/s) and MFU at a bert-base shape
   (random weights, 128 tokens) - the GPU figure (goal >= 8,000 seq/s on an H100); it runs on a
   CPU too, where MFU is n/a (PEAK_TFLOPS knows GPUs only)

    python scripts/benchmark.py [--task mrpc] [--rows 1000]
    python scripts/benchmark.py --config configs/demo-squad.yaml --task squad2 --rows 200   # token-level
        # features of windows; the config draws SQuAD's train split from its dev file, the one that ships
    python scripts/benchmark.py --throughput-only             # item 6 alone (on a GPU machine)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings
from bertvision.config.workflow import WorkflowSettings, load_workflow_config
from bertvision.data.tokenized import TokenizedSplit, bucketed_batches, collate, padding_ratio
from bertvision.features.encode import cls_states, frozen_encoder, plain_forward
from bertvision.features.extractors import iter_blocks
from bertvision.features.source import StreamSource
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.layout import head_metrics_files, split_file
from bertvision.models.backbone import resolve_pretrained
from bertvision.registry.heads import head_pair
from bertvision.registry.states import STATES
from bertvision.registry.task_spec import splits_of
from bertvision.registry.tasks import get_task
from bertvision.runtime.device import pick_device, set_threads, to_device
from bertvision.script_support import run_script
from bertvision.stages.download import download_task
from bertvision.stages.extract import extract_shard
from bertvision.stages.tokenize import tokenize_task
from bertvision.stages.train_heads import train_heads

REPO = Path(__file__).resolve().parents[1]


def joint_heads(s, task: str) -> dict:
    """The task's heads that read a pair as one sequence: streamed states are never apart, so the
    side-by-side trains these (a head reading a pair apart would need its own extraction)."""
    return {n: h for n, h in s.head_settings(task).items() if head_pair(h.spec) == "joint"}


def plain_forward_seconds(
    checkpoint, split: TokenizedSplit, settings: ExtractSettings, compute: ExtractCompute, device
) -> float:
    model = frozen_encoder(checkpoint, device)
    pad_id = model.config.pad_token_id or 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _, _, batches in iter_blocks(split, 0, len(split), settings.block_rows, settings.batch_size):
            for rows in batches:
                batch = collate(split, rows, pad_id)
                plain_forward(model, to_device(batch, device), device, compute.precision).cpu()
    return time.perf_counter() - t0


# Dense bf16 peak FLOP/s by GPU name (vendor datasheets; SXM parts)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def forward_flops(layers: int, hidden: int, tokens: int, intermediate: int) -> float:
    """FLOPs of one encoder forward over one sequence of ``tokens``: the matmuls of attention
    (QKV, output) and the feed-forward (2 per multiply-add), plus attention scores and values."""
    dense = 2 * tokens * layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return dense + 4 * layers * tokens * tokens * hidden


def extraction_throughput(
    device,
    precision: str,
    batch_size: int = 256,
    tokens: int = 128,
    seconds: float = 10.0,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    compile_model: bool = False,
) -> dict:
    """Sequences/s of the extraction forward (every layer's [CLS] state, copied to the host as
    float16) of a random encoder at this shape (bert-base by default), and its MFU where the
    device's peak is known."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden
    )
    model = BertModel(config, add_pooling_layer=False).to(device).eval()
    if compile_model:
        model = torch.compile(model)
    generator = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(1000, 30000, (batch_size, tokens), generator=generator).to(device),
        "attention_mask": torch.ones(batch_size, tokens, dtype=torch.long, device=device),
    }

    def step():
        with torch.inference_mode():
            return cls_states(model, batch, device, precision).to("cpu", torch.float16)

    for _ in range(3):  # warm-up (kernels, autotuning, compilation)
        step()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or done < 2 * batch_size:
        step()
        done += batch_size
    elapsed = time.perf_counter() - t0
    rate = done / elapsed
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    flops = forward_flops(layers, hidden, tokens, 4 * hidden)
    return {
        "device": name,
        "sequences_per_s": rate,
        "tflops": rate * flops / 1e12,
        "peak_tflops": peak,
        "mfu": rate * flops / (peak * 1e12) if peak else None,
        "batch_size": batch_size,
        "tokens": tokens,
        "precision": precision,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def shared_loops(records: list[dict]) -> tuple[float, float, int]:
    """Seconds waiting for data and seconds of training loop, over head runs of which those trained
    in lockstep share one loop (each record gives the shared loop's figures): each loop counted once;
    and how many loops."""
    loops = {(r["train_loop_seconds"], r["data_wait_seconds"]) for r in records}
    return sum(w for _, w in loops), sum(t for t, _ in loops), len(loops)


def storage_comparison(
    task,
    s,
    args,
    tmp: Path,
    encoder_dir: Path,
    feat: Path,
    extract_all_seconds: float,
    on_disk: int,
    stored_seconds: float,
    stored_records: list,
) -> list[tuple]:
    """Train the same heads and seeds on states streamed from ``encoder_dir``; rows of the side-by-side
    table (stored vs streamed)."""
    source = StreamSource(
        str(encoder_dir),
        str(tmp / "tokens"),
        s.extract(),
        s.extract_compute(),
        {"model": s.models[0], "task": args.task, "checkpoint": "0", "ft_seed": 0, "label_kind": task.kind},
    )
    t0 = time.perf_counter()
    train_heads(
        task,
        joint_heads(s, args.task),
        s.head_runtime(),
        source,
        s.head_seeds,
        tmp / "heads-streamed",
        threads=args.threads,
        raw_dir=tmp / "raw",
    )
    streamed_seconds = time.perf_counter() - t0
    streamed = [json.loads(p.read_text()) for p in head_metrics_files([tmp / "heads-streamed"])]
    rows = []
    for name, records, extract_s, head_s, nbytes in (
        ("stored", stored_records, extract_all_seconds, stored_seconds, on_disk),
        ("streamed", streamed, 0.0, streamed_seconds, 0),
    ):
        head_epochs = sum(len(r["history"]) for r in records)
        wait, loop, _ = shared_loops(records)
        score = float(np.mean([task.headline(r["metrics"]) for r in records]))
        rows.append(
            (
                name,
                nbytes,
                extract_s,
                head_s,
                head_s / head_epochs,
                wait / loop if loop else 0.0,
                extract_s + head_s,
                score,
                head_epochs,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--rows", type=int, default=1000, help="train rows drawn from the task")
    parser.add_argument("--eval-rows", type=int, help="dev rows drawn from the task (default: the config's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--throughput-only", action="store_true", help="only item 6")
    parser.add_argument("--throughput-seconds", type=float, default=10.0)
    parser.add_argument("--throughput-batch", type=int, default=256)
    parser.add_argument("--compile", action="store_true", help="torch.compile the throughput model")
    args = parser.parse_args()

    config = load_workflow_config(args.config)
    config["tasks"].setdefault(args.task, None)
    s = WorkflowSettings(config, str(args.config))
    task = get_task(args.task)
    model_name = s.models[0]
    backbone = s.pretrained(model_name)
    set_threads(args.threads)
    ex_settings, ex_compute = s.extract(), s.extract_compute()
    device = pick_device(ex_compute.device)
    ft_batch_size = s.finetune(model_name, args.task).optimizer.batch_size
    precision = "auto" if device.type == "cuda" else ex_compute.precision
    if args.throughput_only:
        print_throughput(
            extraction_throughput(
                device, precision, args.throughput_batch, seconds=args.throughput_seconds, compile_model=args.compile
            )
        )
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sizes = {"train_size": args.rows} | ({"eval_size": args.eval_rows} if args.eval_rows else {})
        download_task(task, s.download(args.task).replace(**sizes), tmp / "raw")
        tokenize_task(task, s.tokenize(model_name, args.task), tmp / "raw", tmp / "tokens")
        train = TokenizedSplit.read(split_file(tmp / "tokens", "train"))

        # 4a. padding in fine-tuning: the batches the fine-tuning loop draws for one epoch.
        ft_batches = bucketed_batches(train.lengths, ft_batch_size, np.random.default_rng(1))
        ft_padding = padding_ratio(train.lengths, ft_batches)

        # Use the pretrained encoder as the checkpoint (extraction cost does not depend on the weights).
        from transformers import AutoModel

        encoder_dir = tmp / "ckpt"
        AutoModel.from_pretrained(resolve_pretrained(backbone)).save_pretrained(encoder_dir)

        # 1. extraction vs plain forward over the same batches, alternating, best of N each; both on
        # PyTorch (the plain forward's runtime), whatever extract.backend says: the ratio is the
        # extraction's own overhead, not one runtime against another (scripts/benchmark_onnx.py's)
        attrs = {"model": model_name, "task": args.task, "checkpoint": "0", "ft_seed": 0, "label_kind": task.kind}
        unit = "tokens" if task.kind == "span" else "examples"
        extract_times, plain_times, stats = [], [], None
        on_torch = ex_compute.replace(backend="torch")
        for r in range(args.repeats):
            plain_times.append(plain_forward_seconds(encoder_dir, train, ex_settings, ex_compute, device))
            out = tmp / f"feat{r}" / "shard-0-of-1"
            t0 = time.perf_counter()
            stats = extract_shard(encoder_dir, tmp / "tokens", out, 0, 1, ["train"], ex_settings, on_torch, attrs)
            extract_times.append(time.perf_counter() - t0)
        # extract_shard includes loading the model once; time that load separately and remove it.
        t0 = time.perf_counter()
        frozen_encoder(encoder_dir, device)
        load_seconds = time.perf_counter() - t0
        extract_best = min(extract_times) - load_seconds
        plain_best = min(plain_times)
        ex_padding = stats["train"]["padded_tokens"] / stats["train"]["real_tokens"]

        # 3. bytes on disk vs the minimum, for all splits of the task.
        feat = tmp / "features"
        t0 = time.perf_counter()
        every_split = list(splits_of(task))
        extract_shard(
            encoder_dir, tmp / "tokens", feat / "shard-0-of-1", 0, 1, every_split, ex_settings, ex_compute, attrs
        )
        write_manifest([feat / "shard-0-of-1"], feat / "manifest.json", list(splits_of(task)))
        extract_all_seconds = time.perf_counter() - t0
        fs = FeatureSet.open(feat / "manifest.json", "train")
        layers, hidden = fs.shape
        on_disk = sum(FeatureSet.open(feat / "manifest.json", sp).bytes_on_disk() for sp in splits_of(task))
        rows = sum(
            int(TokenizedSplit.read(split_file(tmp / "tokens", sp)).lengths.sum())
            if task.kind == "span"
            else FeatureSet.open(feat / "manifest.json", sp).n_examples
            for sp in splits_of(task)
        )
        # every kind of per-example state the shards hold is a minimum of its own (span tasks: tokens)
        width = hidden if task.kind == "span" else sum(STATES[r].width(hidden) for r in fs.manifest["reads"])
        minimum = rows * layers * width * 2
        n_rows = sum(FeatureSet.open(feat / "manifest.json", sp).n_examples for sp in splits_of(task))

        # 2. head training: every default head, every default seed.
        t0 = time.perf_counter()
        train_heads(
            task,
            joint_heads(s, args.task),
            s.head_runtime(),
            feat / "manifest.json",
            s.head_seeds,
            tmp / "heads",
            threads=args.threads,
            raw_dir=tmp / "raw",
        )
        stored_seconds = time.perf_counter() - t0
        records = [json.loads(path.read_text()) for path in head_metrics_files([tmp / "heads"])]
        wait, loop, loops = shared_loops(records)

        # 5. the same heads on streamed states
        storage = storage_comparison(
            task, s, args, tmp, encoder_dir, feat, extract_all_seconds, on_disk, stored_seconds, records
        )
        throughput = extraction_throughput(
            device, precision, args.throughput_batch, seconds=args.throughput_seconds, compile_model=args.compile
        )

    figures = [
        (
            "extraction / plain forward (same batches)",
            extract_best / plain_best,
            "<= 1.10",
            f"{extract_best:.2f}s vs {plain_best:.2f}s, best of {args.repeats}",
        ),
        (
            "head training: data-wait share",
            wait / loop,
            "<= 0.05",
            f"{wait:.3f}s of {loop:.2f}s over {loops} training loops ({len(records)} head runs)",
        ),
        (
            "feature bytes on disk / minimum",
            on_disk / minimum,
            "<= 1.05",
            f"{on_disk:,} B vs {minimum:,} B for {rows} {unit} x {layers} layers x {width} wide",
        ),
        ("padded / real tokens, fine-tuning", ft_padding, "<= 1.15", f"batch {ft_batch_size}"),
        ("padded / real tokens, extraction", ex_padding, "<= 1.15", f"batch {ex_settings.batch_size}"),
    ]
    print(
        f"bertvision benchmark: backbone {backbone}, task {args.task} ({args.rows} train rows), device {device}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    print(f"{'measure':45s} {'value':>8s}  {'goal':8s} detail")
    for name, value, goal, detail in figures:
        print(f"{name:45s} {value:8.3f}  {goal:8s} {detail}")
    print(
        f"median plain forward {statistics.median(plain_times):.2f}s; model load {load_seconds:.2f}s; "
        f"{len(train)} train {'windows' if task.kind == 'span' else 'examples'}, "
        f"feature bytes per {'window' if task.kind == 'span' else 'example'}: {on_disk / n_rows:,.0f}"
    )
    print(
        f"\nstored vs streamed head training ({len(joint_heads(s, args.task))} heads x {len(s.head_seeds)} seeds, "
        f"all splits; {task.primary_metric} is the dev mean over the runs)"
    )
    print(
        f"{'states':9s} {'bytes':>12s} {'extract s':>10s} {'heads s':>9s} {'s/head-epoch':>13s} {'data wait':>10s} "
        f"{'total s':>8s} {'dev':>7s} {'head-epochs':>12s}"
    )
    for name, nbytes, extract_s, head_s, per_epoch, wait_share, total, score, head_epochs in storage:
        print(
            f"{name:9s} {nbytes:12,d} {extract_s:10.2f} {head_s:9.2f} {per_epoch:13.3f} {wait_share:10.1%} "
            f"{total:8.2f} {score:7.3f} {head_epochs:12d}"
        )
    print()
    print_throughput(throughput)


def print_throughput(t: dict) -> None:
    mfu = f"{t['mfu']:.1%}" if t["mfu"] is not None else "n/a (no known peak for this device)"
    print(
        f"extraction throughput, bert-base shape ({t['parameters'] / 1e6:.0f}M parameters, random weights), "
        f"{t['tokens']} tokens, batch {t['batch_size']}, {t['precision']} on {t['device']}: "
        f"{t['sequences_per_s']:,.0f} sequences/s, {t['tflops']:.1f} TFLOP/s, MFU {mfu} (goal on an H100: "
        f">= 8,000 sequences/s)"
    )


if __name__ == "__main__":
    run_script(main)
