"""Command line: one subcommand per workflow rule. Each takes explicit paths and its stage's
typed settings as JSON (what Snakemake's params track, so that a changed setting reruns exactly
the jobs that read it); ``bertvision COMMAND --help`` lists every settings key with the config
key that sets it. Known errors (a bad config key, data row or setting, a missing file) print
one line each and exit with status 2."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
from pathlib import Path

from bertvision.config import settings as typed
from bertvision.errors import BertvisionError, SettingsError
from bertvision.features.source import feature_source
from bertvision.reporting.commands import add_reporting_commands
from bertvision.serving.commands import add_serving_commands

USAGE_ERROR = 2


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


def _task(name: str):
    from bertvision.registry.tasks import get_task

    try:
        return get_task(name)
    except KeyError as err:
        raise SettingsError(f"--task: {err.args[0]}") from None


@contextlib.contextmanager
def retry_on_out_of_memory(stage: str, micro_batches: int):
    """Turn a CUDA out-of-memory error into a clear message and exit status 3: a resubmission
    (Snakemake's ``--retries``) runs the next attempt with smaller per-device batches."""
    import torch

    from bertvision.runtime.device import OUT_OF_MEMORY_EXIT

    try:
        yield
    except torch.OutOfMemoryError as err:
        print(
            f"bertvision {stage}: CUDA out of memory with each batch split into {micro_batches} "
            f"micro-batch(es) ({err}). Run Snakemake with --retries N: attempt n splits each batch into "
            f"2^(n-1) micro-batches (the effective batch and the results stay the same) and asks for more "
            f"memory and time.",
            file=sys.stderr,
        )
        raise SystemExit(OUT_OF_MEMORY_EXIT) from err


def cmd_download(a):
    from bertvision.stages.download import download_task

    download_task(_task(a.task), typed.DownloadSettings.from_json(a.settings), a.out_dir)


def cmd_tokenize(a):
    from bertvision.stages.tokenize import tokenize_task

    tokenize_task(_task(a.task), typed.TokenizeSettings.from_json(a.settings), a.raw_dir, a.out_dir)


def cmd_finetune(a):
    from bertvision.stages.finetune import finetune

    task = _task(a.task)
    settings = typed.FinetuneSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("finetune", a.micro_batches):
        finetune(
            task, a.model, settings, compute, a.tokens_dir, a.raw_dir, a.out_dir, a.seed, a.threads, a.micro_batches
        )


def cmd_baseline(a):
    from bertvision.stages.baseline import full_finetune

    settings = typed.BaselineSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("baseline", a.micro_batches):
        full_finetune(
            _task(a.task),
            a.model,
            settings,
            compute,
            a.tokens_dir,
            a.raw_dir,
            a.out_dir,
            a.seed,
            a.threads,
            a.micro_batches,
        )


def cmd_extract(a):
    from bertvision.registry.tasks import splits_of
    from bertvision.stages.extract import extract_shard

    splits = splits_of(_task(a.task))
    settings = typed.ExtractSettings.from_json(a.settings)
    compute = typed.ExtractCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("extract", a.micro_batches):
        extract_shard(
            a.checkpoint,
            a.tokens_dir,
            a.out_dir,
            a.shard,
            a.shards,
            splits,
            settings,
            compute,
            a.attrs,
            a.threads,
            a.micro_batches,
        )


def cmd_manifest(a):
    from bertvision.features.store import write_manifest
    from bertvision.registry.tasks import splits_of

    write_manifest(a.shard_dirs, a.out, splits_of(_task(a.task)))


def cmd_train_heads(a):
    from bertvision.stages.train_heads import train_heads

    train_heads(
        _task(a.task),
        a.heads,
        typed.HeadTrainingSettings.from_json(a.settings),
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        a.manifest,
        a.seeds,
        a.out_dir,
        a.threads,
        a.raw_dir,
        a.bert_logits,
        dict(a.searched),
        a.train_fraction,
    )


def cmd_finetune_mixture(a):
    from bertvision.stages.finetune_mixture import finetune_mixture

    settings = typed.MixtureSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("finetune-mixture", a.micro_batches):
        finetune_mixture(
            a.encoder, a.model, settings, compute, dict(a.tokens_dirs), a.out_dir, a.seed, a.threads, a.micro_batches
        )


def cmd_head_transfer(a):
    from bertvision.stages.head_transfer import apply_heads_across_tasks

    settings = typed.HeadTrainingSettings.from_json(a.settings)
    apply_heads_across_tasks(
        _task(a.source_task),
        _task(a.task),
        a.head_dir,
        a.heads,
        a.manifest,
        a.raw_dir,
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        settings.in_memory_max_mb,
        a.out,
        a.threads,
    )


def cmd_transfer(a):
    from bertvision.stages.transfer import transfer

    settings = typed.HeadTrainingSettings.from_json(a.settings)
    transfer(
        _task(a.task),
        a.head_dirs,
        a.manifests,
        a.raw_dir,
        a.out,
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        settings.in_memory_max_mb,
        a.threads,
    )


def cmd_search_worker(a):
    from bertvision.stages.search import run_worker

    run_worker(
        _task(a.task),
        a.study,
        a.spec,
        typed.HeadTrainingSettings.from_json(a.settings),
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        typed.SearchSettings.from_json(a.search, "--search"),
        a.manifest,
        a.raw_dir,
        a.storage,
        a.worker,
        a.out,
        a.threads,
    )


def cmd_search_best(a):
    from bertvision.stages.search import summarize_study

    summarize_study(a.workers, a.out)


def cmd_validate_config(a):
    import yaml

    from bertvision.config.workflow import WorkflowSettings

    settings = WorkflowSettings.from_file(a.config)
    if a.show:
        print(yaml.safe_dump(settings.config, sort_keys=False), end="")
    else:
        print(f"{a.config}: valid")


def cmd_clean(a):
    from bertvision.layout import ROOTS

    for root in ROOTS:
        path = Path(a.dir) / root
        if path.exists():
            shutil.rmtree(path)
            print(f"removed {path}")


def _settings(s, flag: str, cls, required: bool = True) -> None:
    s.add_argument(flag, required=required, metavar="JSON", help=f"the stage's {cls.__name__} (see below)")
    s.epilog = ((s.epilog + "\n\n") if s.epilog else "") + f"{flag}: {cls.describe()}"


def _sub(sub, name: str, func, help: str):
    s = sub.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.set_defaults(func=func)
    return s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertvision", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = _sub(sub, "download", cmd_download, "task source -> canonical parquet splits (rule download)")
    s.add_argument("--task", required=True)
    _settings(s, "--settings", typed.DownloadSettings)
    s.add_argument("--out-dir", type=Path, required=True)

    s = _sub(sub, "tokenize", cmd_tokenize, "canonical splits -> token ids (rule tokenize)")
    s.add_argument("--task", required=True)
    _settings(s, "--settings", typed.TokenizeSettings)
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--out-dir", type=Path, required=True)

    for name, command, settings, what in (
        (
            "finetune",
            cmd_finetune,
            typed.FinetuneSettings,
            "partial fine-tuning with checkpoints at epoch fractions (rule finetune)",
        ),
        (
            "baseline",
            cmd_baseline,
            typed.BaselineSettings,
            "full fine-tuning, the epoch kept chosen on the selection split (rule baseline)",
        ),
    ):
        s = _sub(sub, name, command, what)
        s.add_argument("--task", required=True)
        s.add_argument("--model", required=True, help="the backbone's name in the config (recorded with the results)")
        _settings(s, "--settings", settings)
        _settings(s, "--compute", typed.FinetuneCompute)
        s.add_argument("--tokens-dir", type=Path, required=True)
        s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
        s.add_argument("--out-dir", type=Path, required=True)
        s.add_argument("--seed", type=int, required=True)
        s.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per batch")
        s.add_argument("--threads", type=int)

    s = _sub(sub, "extract", cmd_extract, "one shard of every split's hidden states of every layer (rule extract)")
    s.add_argument("--task", required=True)
    s.add_argument("--checkpoint", type=Path, required=True)
    s.add_argument("--tokens-dir", type=Path, required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--shard", type=int, required=True)
    s.add_argument("--shards", type=int, required=True)
    _settings(s, "--settings", typed.ExtractSettings)
    _settings(s, "--compute", typed.ExtractCompute)
    s.add_argument("--attrs", type=_json, required=True, help="where the features come from (stored in each shard)")
    s.add_argument("--micro-batches", type=int, default=1, help="divide the batch size by this")
    s.add_argument("--threads", type=int)

    s = _sub(
        sub, "manifest", cmd_manifest, "check a checkpoint's shards and write its manifest (rule feature_manifest)"
    )
    s.add_argument("--task", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--shard-dirs", type=Path, nargs="+", required=True)

    s = _sub(
        sub,
        "train-heads",
        cmd_train_heads,
        "train every head on one checkpoint's features, per seed (rules train_heads, train_heads_subset)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--heads", type=_json, required=True, help='{"name": {"type": ..., options}, ...}')
    _settings(s, "--settings", typed.HeadTrainingSettings)
    _settings(s, "--runtime", typed.HeadRuntimeSettings)
    s.add_argument(
        "--manifest",
        type=feature_source,
        required=True,
        metavar="MANIFEST|SOURCE_JSON",
        help="the feature manifest, or a stream source (JSON) for store: false",
    )
    s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
    s.add_argument(
        "--bert-logits",
        type=Path,
        nargs="?",
        help="BERT's eval_logits.npz at this checkpoint (ensembles; none on a shared encoder)",
    )
    s.add_argument("--seeds", type=int, nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument(
        "--searched",
        type=_name_path,
        nargs="*",
        default=[],
        help="HEAD=best.json: train HEAD with its search's best parameters",
    )
    s.add_argument("--train-fraction", type=float, default=1.0, help="train on this nested share of the rows")
    s.add_argument("--threads", type=int)

    s = _sub(
        sub,
        "transfer",
        cmd_transfer,
        "evaluate heads trained on one checkpoint on every checkpoint's features (rule transfer)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--head-dirs", type=Path, nargs="+", required=True, help="train_heads outputs, one per checkpoint")
    s.add_argument(
        "--manifests",
        type=feature_source,
        nargs="+",
        required=True,
        help="feature manifests (or stream sources as JSON) of the checkpoints",
    )
    s.add_argument("--raw-dir", type=Path, required=True)
    _settings(s, "--settings", typed.HeadTrainingSettings)
    _settings(s, "--runtime", typed.HeadRuntimeSettings)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)

    s = _sub(
        sub,
        "finetune-mixture",
        cmd_finetune_mixture,
        "fine-tune one encoder on a mixture of tasks, a shared encoder (rule finetune_mixture)",
    )
    s.add_argument("--encoder", required=True, help="the mixture's name in the config (recorded)")
    s.add_argument("--model", required=True, help="the backbone's name in the config (recorded)")
    _settings(s, "--settings", typed.MixtureSettings)
    _settings(s, "--compute", typed.FinetuneCompute)
    s.add_argument("--tokens-dirs", type=_name_path, nargs="+", required=True, help="TASK=DIR, every mixed task")
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation steps per batch")
    s.add_argument("--threads", type=int)

    s = _sub(
        sub,
        "head-transfer",
        cmd_head_transfer,
        "a task's heads applied as they are to a task with the same labels (rule head_transfer)",
    )
    s.add_argument("--source-task", required=True)
    s.add_argument("--task", required=True, help="the target task")
    s.add_argument("--head-dir", type=Path, required=True, help="the source task's train_heads output")
    s.add_argument("--heads", nargs="+", required=True, help="head names to apply")
    s.add_argument("--manifest", type=Path, required=True, help="the target's features of the source's encoder")
    s.add_argument("--raw-dir", type=Path, required=True, help="the target task's canonical splits")
    _settings(s, "--settings", typed.HeadTrainingSettings)
    _settings(s, "--runtime", typed.HeadRuntimeSettings)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)

    s = _sub(
        sub,
        "search-worker",
        cmd_search_worker,
        "run one worker's share of an optuna study of a head (rule search_worker)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--study", type=_json, required=True, help="the study's keys: model, task, ftseed, frac, head")
    s.add_argument("--spec", type=_json, required=True, help="the head's configured architecture")
    _settings(s, "--settings", typed.HeadTrainingSettings)
    _settings(s, "--runtime", typed.HeadRuntimeSettings)
    _settings(s, "--search", typed.SearchSettings)
    s.add_argument(
        "--manifest",
        type=feature_source,
        required=True,
        metavar="MANIFEST|SOURCE_JSON",
        help="the feature manifest, or a stream source (JSON) for store: false",
    )
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--storage", required=True, help="journal file path or RDB URL")
    s.add_argument("--worker", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)

    s = _sub(
        sub, "search-best", cmd_search_best, "a finished study's best parameters and trial counts (rule search_best)"
    )
    s.add_argument("--workers", type=Path, nargs="+", required=True, help="the study's worker records")
    s.add_argument("--out", type=Path, required=True)

    s = _sub(sub, "validate-config", cmd_validate_config, "check a config file against the schema and the registries")
    s.add_argument("config", type=Path)
    s.add_argument("--show", action="store_true", help="print the effective config, every default filled in")

    s = _sub(sub, "clean", cmd_clean, "remove every artifact folder of a working directory (bertvision.layout.ROOTS)")
    s.add_argument("--dir", type=Path, default=Path("."), help="the working directory")

    add_reporting_commands(sub, _sub, _json)
    add_serving_commands(sub, _sub, _json, _name_path)
    return p


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except BertvisionError as err:
        for line in str(err).splitlines():
            print(f"bertvision {args.command}: error: {line}", file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
