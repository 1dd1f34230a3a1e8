"""Command line: one subcommand per workflow stage. Rules call these; each takes explicit paths
and a JSON object of the stage's settings (which is what Snakemake's params track)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from None


def _name_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


@contextlib.contextmanager
def retry_on_out_of_memory(stage: str, micro_batches: int):
    """Turn a CUDA out-of-memory error into a clear message and exit status 3: a resubmission
    (Snakemake's ``--retries``) runs the next attempt with smaller per-device batches."""
    import torch

    from bertvision.device import OUT_OF_MEMORY_EXIT

    try:
        yield
    except torch.OutOfMemoryError as err:
        print(f"bertvision {stage}: CUDA out of memory with each batch split into {micro_batches} "
              f"micro-batch(es) ({err}). Run Snakemake with --retries N: attempt n splits each batch into "
              f"2^(n-1) micro-batches (the effective batch and the results stay the same) and asks for more "
              f"memory and time.", file=sys.stderr)
        raise SystemExit(OUT_OF_MEMORY_EXIT) from err


def cmd_download(a):
    from bertvision.data.download import download_task
    from bertvision.tasks import get_task

    download_task(get_task(a.task), a.settings, a.out_dir)


def cmd_tokenize(a):
    from bertvision.tasks import get_task, splits_of
    from bertvision.tokenization import tokenize_task

    task = get_task(a.task)
    tokenize_task(task, a.backbone, a.max_length, a.raw_dir, a.out_dir, splits_of(task), a.doc_stride)


def cmd_finetune(a):
    from bertvision.finetune import finetune
    from bertvision.tasks import get_task

    with retry_on_out_of_memory("finetune", a.micro_batches):
        finetune(get_task(a.task), a.backbone, a.tokens_dir, a.out_dir, a.settings, a.seed, a.threads, a.raw_dir,
                 a.micro_batches)


def cmd_extract(a):
    from bertvision.extract import extract_shard

    with retry_on_out_of_memory("extract", a.micro_batches):
        extract_shard(a.checkpoint, a.tokens_dir, a.out_dir, a.shard, a.shards, a.splits, a.settings, a.attrs,
                      a.threads, a.micro_batches)


def cmd_manifest(a):
    from bertvision.features import write_manifest

    write_manifest(a.shard_dirs, a.out, a.splits)


def cmd_train_heads(a):
    from bertvision.tasks import get_task
    from bertvision.train_head import train_heads

    train_heads(get_task(a.task), a.heads, a.settings, a.manifest, a.seeds, a.out_dir, a.threads, a.raw_dir,
                a.bert_logits, dict(a.searched), a.train_fraction)


def cmd_transfer(a):
    from bertvision.tasks import get_task
    from bertvision.transfer import transfer

    transfer(get_task(a.task), a.head_dirs, a.manifests, a.raw_dir, a.out, a.settings, a.threads)


def cmd_search_worker(a):
    from bertvision.search import run_worker
    from bertvision.tasks import get_task

    run_worker(get_task(a.task), a.head, a.spec, a.settings, a.search, a.manifest, a.raw_dir, a.storage,
               a.study_label, a.worker, a.out, a.threads)


def cmd_search_best(a):
    from bertvision.search import summarize_study

    summarize_study(a.workers, a.out)


def cmd_tables(a):
    from bertvision.tables import build_tables

    head_metrics = sorted(p for d in a.head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    build_tables(a.bert_metrics, head_metrics, a.benchmarks, a.heads,
                 {"md": a.md, "csv": a.csv, "squad_md": a.squad_md, "squad_csv": a.squad_csv,
                  "timing_md": a.timing_md, "timing_csv": a.timing_csv, "cost_md": a.cost_md,
                  "cost_csv": a.cost_csv}, a.manifests)


def cmd_experiment_tables(a):
    from bertvision.experiment_tables import build_experiment_tables

    runs = lambda dirs: sorted(p for d in dirs for p in Path(d).glob("*/seed*/metrics.json"))  # noqa: E731
    build_experiment_tables(a.search, runs(a.subset_dirs), runs(a.head_dirs), a.bert_metrics, a.transfer,
                            {f"{name}_{ext}": getattr(a, f"{name}_{ext}")
                             for name in ("search", "data_fraction", "transfer") for ext in ("md", "csv")})


def cmd_plots(a):
    from bertvision.plots import build_plots

    head_metrics = sorted(p for d in a.head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    build_plots(a.tables, head_metrics, a.tasks, a.out_dir)


def cmd_plot_data_fraction(a):
    from bertvision.plots import data_fraction_curves

    data_fraction_curves(a.table, a.out)


def cmd_validate_config(a):
    from bertvision.config import load_config

    load_config(a.config)
    print(f"{a.config}: valid")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertvision", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("download", help="task source -> canonical parquet splits")
    s.add_argument("--task", required=True)
    s.add_argument("--settings", type=_json, required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.set_defaults(func=cmd_download)

    s = sub.add_parser("tokenize", help="canonical splits -> token ids")
    s.add_argument("--task", required=True)
    s.add_argument("--backbone", required=True)
    s.add_argument("--max-length", type=int, required=True)
    s.add_argument("--doc-stride", type=int, default=0, help="span tasks: overlap of context windows")
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.set_defaults(func=cmd_tokenize)

    s = sub.add_parser("finetune", help="partial fine-tuning with checkpoints at epoch fractions")
    s.add_argument("--task", required=True)
    s.add_argument("--backbone", required=True)
    s.add_argument("--tokens-dir", type=Path, required=True)
    s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--settings", type=_json, required=True)
    s.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per batch")
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_finetune)

    s = sub.add_parser("extract", help="one shard (of every split) of [CLS] hidden states of every layer")
    s.add_argument("--checkpoint", type=Path, required=True)
    s.add_argument("--tokens-dir", type=Path, required=True)
    s.add_argument("--splits", nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--shard", type=int, required=True)
    s.add_argument("--shards", type=int, required=True)
    s.add_argument("--settings", type=_json, required=True)
    s.add_argument("--attrs", type=_json, required=True)
    s.add_argument("--micro-batches", type=int, default=1, help="divide the batch size by this")
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("manifest", help="check a checkpoint's shards and write its manifest")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--splits", nargs="+", required=True)
    s.add_argument("--shard-dirs", type=Path, nargs="+", required=True)
    s.set_defaults(func=cmd_manifest)

    s = sub.add_parser("train-heads", help="train every head on one checkpoint's features, per seed")
    s.add_argument("--task", required=True)
    s.add_argument("--heads", type=_json, required=True, help='{"name": {"type": ...}, ...}')
    s.add_argument("--settings", type=_json, required=True)
    s.add_argument("--manifest", type=Path, required=True)
    s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
    s.add_argument("--bert-logits", type=Path, help="BERT's eval_logits.npz at this checkpoint (ensembles)")
    s.add_argument("--seeds", type=int, nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--searched", type=_name_path, nargs="*", default=[],
                   help="HEAD=best.json: train HEAD with its search's best parameters")
    s.add_argument("--train-fraction", type=float, default=1.0, help="train on this nested share of the rows")
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_train_heads)

    s = sub.add_parser("transfer", help="evaluate heads trained on one checkpoint on every checkpoint's features")
    s.add_argument("--task", required=True)
    s.add_argument("--head-dirs", type=Path, nargs="+", required=True, help="train_heads outputs, one per checkpoint")
    s.add_argument("--manifests", type=Path, nargs="+", required=True, help="feature manifests of the checkpoints")
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--settings", type=_json, required=True, help="the task's head training settings")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_transfer)

    s = sub.add_parser("search-worker", help="run one worker's share of an optuna study of a head")
    s.add_argument("--task", required=True)
    s.add_argument("--head", required=True)
    s.add_argument("--spec", type=_json, required=True, help="the head's configured architecture")
    s.add_argument("--settings", type=_json, required=True, help="the configured head training settings")
    s.add_argument("--search", type=_json, required=True, help="the search section of the config")
    s.add_argument("--manifest", type=Path, required=True)
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--storage", required=True, help="journal file path or RDB URL")
    s.add_argument("--study-label", required=True, help="study name prefix (a digest of the inputs follows)")
    s.add_argument("--worker", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_search_worker)

    s = sub.add_parser("search-best", help="a finished study's best parameters and trial counts")
    s.add_argument("--workers", type=Path, nargs="+", required=True, help="the study's worker records")
    s.add_argument("--out", type=Path, required=True)
    s.set_defaults(func=cmd_search_best)

    s = sub.add_parser("tables", help="result and timing tables from metrics and benchmark files")
    s.add_argument("--bert-metrics", type=Path, nargs="*", default=[])
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[], help="train_heads output directories")
    s.add_argument("--benchmarks", type=Path, nargs="*", default=[])
    s.add_argument("--heads", nargs="*", default=[])
    s.add_argument("--md", type=Path, required=True)
    s.add_argument("--csv", type=Path, required=True)
    s.add_argument("--squad-md", type=Path, required=True)
    s.add_argument("--squad-csv", type=Path, required=True)
    s.add_argument("--cost-md", type=Path, required=True)
    s.add_argument("--cost-csv", type=Path, required=True)
    s.add_argument("--manifests", type=Path, nargs="*", default=[], help="feature manifests (cost table)")
    s.add_argument("--timing-md", type=Path, required=True)
    s.add_argument("--timing-csv", type=Path, required=True)
    s.set_defaults(func=cmd_tables)

    s = sub.add_parser("experiment-tables", help="search, data-fraction and transfer tables")
    s.add_argument("--search", type=Path, nargs="*", default=[], help="best.json of every study")
    s.add_argument("--subset-dirs", type=Path, nargs="*", default=[], help="train_heads_subset outputs")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[], help="train_heads outputs (the full data)")
    s.add_argument("--bert-metrics", type=Path, nargs="*", default=[])
    s.add_argument("--transfer", type=Path, nargs="*", default=[], help="transfer records")
    for name in ("search", "data_fraction", "transfer"):
        for ext in ("md", "csv"):
            s.add_argument(f"--{name.replace('_', '-')}-{ext}", type=Path, required=True)
    s.set_defaults(func=cmd_experiment_tables)

    s = sub.add_parser("plots", help="PNG plots from the result tables and head metrics")
    s.add_argument("--tables", type=Path, nargs="+", required=True, help="glue.csv / squad.csv")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[])
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.set_defaults(func=cmd_plots)

    s = sub.add_parser("plot-data-fraction", help="score vs share of training data (PNG)")
    s.add_argument("--table", type=Path, required=True, help="data_fraction.csv")
    s.add_argument("--out", type=Path, required=True)
    s.set_defaults(func=cmd_plot_data_fraction)

    s = sub.add_parser("validate-config", help="check a config file against the schema")
    s.add_argument("config", type=Path)
    s.set_defaults(func=cmd_validate_config)
    return p


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    args = build_parser().parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
