"""Measure, in one run on this machine, the pipeline's efficiency ratios for a backbone:

1. extraction time / plain forward time over the same batches        (goal <= 1.10)
2. share of head-training wall time spent waiting for data           (goal <= 5%)
3. feature bytes on disk / minimum (examples, or tokens for span tasks, x layers x hidden x 2)
                                                                      (goal <= 1.05)
4. padded tokens / real tokens in fine-tuning and in extraction       (goal <= 1.15)

    python scripts/benchmark.py [--task mrpc] [--rows 1000]
    python scripts/benchmark.py --task squad2 --rows 300     # token-level features of windows
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
from bertvision.config.workflow import WorkflowSettings, load_config
from bertvision.data.tokenized import TokenizedSplit, bucketed_batches, collate, padding_ratio
from bertvision.features.encode import frozen_encoder, plain_forward
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.layout import head_metrics_files, split_file
from bertvision.models.backbone import resolve_pretrained
from bertvision.registry.tasks import get_task, splits_of
from bertvision.runtime.device import pick_device, set_threads, to_device
from bertvision.stages.download import download_task
from bertvision.stages.extract import extract_shard, iter_blocks
from bertvision.stages.tokenize import tokenize_task
from bertvision.stages.train_heads import train_heads

REPO = Path(__file__).resolve().parents[1]


def plain_forward_seconds(checkpoint, split: TokenizedSplit, settings: ExtractSettings, compute: ExtractCompute,
                          device) -> float:
    model = frozen_encoder(checkpoint, device)
    pad_id = model.config.pad_token_id or 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _, _, batches in iter_blocks(split, 0, len(split), settings.block_rows, settings.batch_size):
            for rows in batches:
                batch = collate(split, rows, pad_id)
                plain_forward(model, to_device(batch, device), device, compute.precision).cpu()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "config.yaml")
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--rows", type=int, default=1000, help="train rows drawn from the task")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    config = load_config(args.config)
    config["data"]["glue_dir"] = str(REPO / config["data"]["glue_dir"])
    config["data"]["squad_dir"] = str(REPO / config["data"]["squad_dir"])
    config["tasks"].setdefault(args.task, None)
    s = WorkflowSettings(config, str(args.config))
    task = get_task(args.task)
    model_name = s.models[0]
    backbone = s.pretrained(model_name)
    set_threads(args.threads)
    ex_settings, ex_compute = s.extract(), s.extract_compute()
    device = pick_device(ex_compute.device)
    ft_batch_size = s.finetune(model_name, args.task).batch_size

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        download_task(task, s.download(args.task).replace(train_size=args.rows), tmp / "raw")
        tokenize_task(task, s.tokenize(model_name, args.task), tmp / "raw", tmp / "tokens")
        train = TokenizedSplit.read(split_file(tmp / "tokens", "train"))

        # 4a. padding in fine-tuning: the batches the fine-tuning loop draws for one epoch.
        ft_batches = bucketed_batches(train.lengths, ft_batch_size, np.random.default_rng(1))
        ft_padding = padding_ratio(train.lengths, ft_batches)

        # Use the pretrained encoder as the checkpoint (extraction cost does not depend on the weights).
        from transformers import AutoModel

        ckpt = tmp / "ckpt"
        AutoModel.from_pretrained(resolve_pretrained(backbone)).save_pretrained(ckpt)

        # 1. extraction vs plain forward over the same batches, alternating, best of N each.
        attrs = {"model": model_name, "task": args.task, "checkpoint": "0", "ft_seed": 0, "label_kind": task.kind}
        unit = "tokens" if task.kind == "span" else "examples"
        extract_times, plain_times, stats = [], [], None
        for r in range(args.repeats):
            plain_times.append(plain_forward_seconds(ckpt, train, ex_settings, ex_compute, device))
            out = tmp / f"feat{r}" / "shard-0-of-1"
            t0 = time.perf_counter()
            stats = extract_shard(ckpt, tmp / "tokens", out, 0, 1, ["train"], ex_settings, ex_compute, attrs)
            extract_times.append(time.perf_counter() - t0)
        # extract_shard includes loading the model once; time that load separately and remove it.
        t0 = time.perf_counter()
        frozen_encoder(ckpt, device)
        load_seconds = time.perf_counter() - t0
        extract_best = min(extract_times) - load_seconds
        plain_best = min(plain_times)
        ex_padding = stats["train"]["padded_tokens"] / stats["train"]["real_tokens"]

        # 3. bytes on disk vs the minimum, for all splits of the task.
        feat = tmp / "features"
        extract_shard(ckpt, tmp / "tokens", feat / "shard-0-of-1", 0, 1, list(splits_of(task)), ex_settings, ex_compute,
                      attrs)
        write_manifest([feat / "shard-0-of-1"], feat / "manifest.json", list(splits_of(task)))
        fs = FeatureSet.open(feat / "manifest.json", "train")
        layers, hidden = fs.shape
        on_disk = sum(FeatureSet.open(feat / "manifest.json", sp).bytes_on_disk() for sp in splits_of(task))
        rows = sum(int(TokenizedSplit.read(split_file(tmp / "tokens", sp)).lengths.sum()) if task.kind == "span"
                   else FeatureSet.open(feat / "manifest.json", sp).n_examples for sp in splits_of(task))
        minimum = rows * layers * hidden * 2
        n_rows = sum(FeatureSet.open(feat / "manifest.json", sp).n_examples for sp in splits_of(task))

        # 2. head training: every default head, every default seed.
        train_heads(task, s.task_heads(args.task), s.head_training(args.task), s.head_runtime(), feat / "manifest.json",
                    s.head_seeds, tmp / "heads", threads=args.threads, raw_dir=tmp / "raw")
        records = [json.loads(path.read_text()) for path in head_metrics_files([tmp / "heads"])]
        wait = sum(r["data_wait_seconds"] for r in records)
        loop = sum(r["train_loop_seconds"] for r in records)

    figures = [
        ("extraction / plain forward (same batches)", extract_best / plain_best, "<= 1.10",
         f"{extract_best:.2f}s vs {plain_best:.2f}s, best of {args.repeats}"),
        ("head training: data-wait share", wait / loop, "<= 0.05",
         f"{wait:.3f}s of {loop:.2f}s over {len(records)} head runs"),
        ("feature bytes on disk / minimum", on_disk / minimum, "<= 1.05",
         f"{on_disk:,} B vs {minimum:,} B for {rows} {unit} x {layers} layers x {hidden}"),
        ("padded / real tokens, fine-tuning", ft_padding, "<= 1.15", f"batch {ft_batch_size}"),
        ("padded / real tokens, extraction", ex_padding, "<= 1.15", f"batch {ex_settings.batch_size}"),
    ]
    print(f"bertvision benchmark: backbone {backbone}, task {args.task} ({args.rows} train rows), device {device}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, torch {torch.__version__}")
    print(f"{'measure':45s} {'value':>8s}  {'goal':8s} detail")
    for name, value, goal, detail in figures:
        print(f"{name:45s} {value:8.3f}  {goal:8s} {detail}")
    print(f"median plain forward {statistics.median(plain_times):.2f}s; model load {load_seconds:.2f}s; "
          f"{len(train)} train {'windows' if task.kind == 'span' else 'examples'}, "
          f"feature bytes per {'window' if task.kind == 'span' else 'example'}: {on_disk / n_rows:,.0f}")


if __name__ == "__main__":
    main()
