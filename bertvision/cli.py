"""Command line: one subcommand per workflow rule. Each takes explicit paths and its stage's
typed settings as JSON (what Snakemake's params track, so that a changed setting reruns exactly
the jobs that read it); ``bertvision COMMAND --help`` lists every settings key with the config
key that sets it. Known errors (a bad config key, data row or setting, a missing file, a full
disk) print one line each and exit with status 2.

Here: the data and feature commands and the housekeeping ones; the encoder, head, reporting
and serving commands live beside the code they drive (``training/encoder_commands.py``,
``training/head_commands.py``, ``reporting/commands.py``, ``serving/commands.py``)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

import bertvision
from bertvision.arguments import (
    json_arg,
    micro_batches_arg,
    name_path_arg,
    retry_on_out_of_memory,
    settings_arg,
    subcommand,
    task_arg,
)
from bertvision.config import settings as typed
from bertvision.errors import BertvisionError, DiskFullError
from bertvision.reporting.commands import add_reporting_commands
from bertvision.runtime.usage import log_usage
from bertvision.serving.commands import add_serving_commands
from bertvision.training.encoder_commands import add_encoder_commands
from bertvision.training.head_commands import add_head_commands

USAGE_ERROR = 2


def cmd_download(a):
    from bertvision.stages.download import download_task

    download_task(task_arg(a.task), typed.DownloadSettings.from_json(a.settings), a.out_dir)


def cmd_tokenize(a):
    from bertvision.stages.tokenize import tokenize_task

    tokenize_task(task_arg(a.task), typed.TokenizeSettings.from_json(a.settings), a.raw_dir, a.out_dir)


def cmd_extract(a):
    from bertvision.registry.tasks import splits_of
    from bertvision.stages.extract import extract_shard

    splits = splits_of(task_arg(a.task))
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

    write_manifest(a.shard_dirs, a.out, splits_of(task_arg(a.task)))


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


def add_data_commands(sub) -> None:
    """``download`` and ``tokenize``."""
    s = subcommand(sub, "download", cmd_download, "task source -> canonical parquet splits (rule download)")
    s.add_argument("--task", required=True)
    settings_arg(s, "--settings", typed.DownloadSettings)
    s.add_argument("--out-dir", type=Path, required=True)

    s = subcommand(sub, "tokenize", cmd_tokenize, "canonical splits -> token ids (rule tokenize)")
    s.add_argument("--task", required=True)
    settings_arg(s, "--settings", typed.TokenizeSettings)
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--out-dir", type=Path, required=True)


def add_feature_commands(sub) -> None:
    """``extract`` and ``manifest``."""
    s = subcommand(
        sub, "extract", cmd_extract, "one shard of every split's hidden states of every layer (rule extract)"
    )
    s.add_argument("--task", required=True)
    s.add_argument("--checkpoint", type=Path, required=True)
    s.add_argument("--tokens-dir", type=Path, required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--shard", type=int, required=True)
    s.add_argument("--shards", type=int, required=True)
    settings_arg(s, "--settings", typed.ExtractSettings)
    settings_arg(s, "--compute", typed.ExtractCompute)
    s.add_argument("--attrs", type=json_arg, required=True, help="where the features come from (stored in each shard)")
    micro_batches_arg(s, "divide the batch size by this")
    s.add_argument("--threads", type=int)

    s = subcommand(
        sub, "manifest", cmd_manifest, "check a checkpoint's shards and write its manifest (rule feature_manifest)"
    )
    s.add_argument("--task", required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--shard-dirs", type=Path, nargs="+", required=True)


def add_housekeeping_commands(sub) -> None:
    """``validate-config`` and ``clean``."""
    s = subcommand(
        sub, "validate-config", cmd_validate_config, "check a config file against the schema and the registries"
    )
    s.add_argument("config", type=Path)
    s.add_argument("--show", action="store_true", help="print the effective config, every default filled in")

    s = subcommand(
        sub, "clean", cmd_clean, "remove every artifact folder of a working directory (bertvision.layout.ROOTS)"
    )
    s.add_argument("--dir", type=Path, default=Path("."), help="the working directory")


def build_parser() -> argparse.ArgumentParser:
    """Every command, in the order the pipeline runs them."""
    p = argparse.ArgumentParser(prog="bertvision", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {bertvision.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    add_data_commands(sub)
    add_encoder_commands(sub)
    add_feature_commands(sub)
    add_head_commands(sub)
    add_reporting_commands(sub, subcommand, json_arg)
    add_serving_commands(sub, subcommand, json_arg, name_path_arg)
    add_housekeeping_commands(sub)
    return p


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
        log_usage(logging.getLogger("bertvision"))
    except BertvisionError as err:
        for line in str(err).splitlines():
            print(f"bertvision {args.command}: error: {line}", file=sys.stderr)
        if isinstance(err, DiskFullError):  # a file HDF5 cannot close: freeing it would crash the process
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(USAGE_ERROR)
        return USAGE_ERROR
    except FileNotFoundError as err:  # an input the command was pointed at is not there
        missing = err.filename or str(err)
        print(f"bertvision {args.command}: error: {missing}: no such file or directory", file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
