"""Command line: one subcommand per workflow stage. Rules call these; each takes explicit paths
and a JSON object of the stage's settings (which is what Snakemake's params track)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from None


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

    finetune(get_task(a.task), a.backbone, a.tokens_dir, a.out_dir, a.settings, a.seed, a.threads, a.raw_dir)


def cmd_extract(a):
    from bertvision.extract import extract_shard

    extract_shard(a.checkpoint, a.tokens_dir, a.out_dir, a.shard, a.shards, a.splits, a.settings, a.attrs,
                  a.threads)


def cmd_manifest(a):
    from bertvision.features import write_manifest

    write_manifest(a.shard_dirs, a.out, a.splits)


def cmd_train_heads(a):
    from bertvision.tasks import get_task
    from bertvision.train_head import train_heads

    train_heads(get_task(a.task), a.heads, a.settings, a.manifest, a.seeds, a.out_dir, a.threads, a.raw_dir,
                a.bert_logits)


def cmd_tables(a):
    from bertvision.tables import build_tables

    head_metrics = sorted(p for d in a.head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    build_tables(a.bert_metrics, head_metrics, a.benchmarks, a.heads,
                 {"md": a.md, "csv": a.csv, "squad_md": a.squad_md, "squad_csv": a.squad_csv,
                  "timing_md": a.timing_md, "timing_csv": a.timing_csv, "cost_md": a.cost_md,
                  "cost_csv": a.cost_csv}, a.manifests)


def cmd_plots(a):
    from bertvision.plots import build_plots

    head_metrics = sorted(p for d in a.head_dirs for p in Path(d).glob("*/seed*/metrics.json"))
    build_plots(a.tables, head_metrics, a.tasks, a.out_dir)


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
    s.add_argument("--threads", type=int)
    s.set_defaults(func=cmd_train_heads)

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

    s = sub.add_parser("plots", help="PNG plots from the result tables and head metrics")
    s.add_argument("--tables", type=Path, nargs="+", required=True, help="glue.csv / squad.csv")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[])
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.set_defaults(func=cmd_plots)

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
