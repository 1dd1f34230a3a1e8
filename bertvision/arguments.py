"""The command line's shared parts, used by ``cli.py`` and every ``commands`` module: argument
types, the subcommand factory, the stage-settings flags (whose help lists every key with the
config key that sets it), the one default that belongs to the command line alone, and the
exit status that asks the scheduler to retry a job that ran out of GPU memory."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from bertvision.errors import SettingsError

# Each batch in one piece. A job that ran out of GPU memory is retried with 2^(attempt - 1)
# micro-batches (rules/common.smk), the effective batch unchanged.
MICRO_BATCHES = 1


def json_arg(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from None


def name_path_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, Path(path)


def task_arg(name: str, flag: str = "--task"):
    """The registered task ``name`` (called by the command, so an unknown name is one error line)."""
    from bertvision.registry.tasks import get_task

    try:
        return get_task(name)
    except KeyError as err:
        raise SettingsError(f"{flag}: {err.args[0]}") from None


def subcommand(sub, name: str, func, help: str) -> argparse.ArgumentParser:
    s = sub.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.set_defaults(func=func)
    return s


def settings_arg(s: argparse.ArgumentParser, flag: str, cls, required: bool = True) -> None:
    """``flag`` takes a stage's settings (``cls``) as JSON; the help lists every key."""
    s.add_argument(flag, required=required, metavar="JSON", help=f"the stage's {cls.__name__} (see below)")
    s.epilog = ((s.epilog + "\n\n") if s.epilog else "") + f"{flag}: {cls.describe()}"


def micro_batches_arg(s: argparse.ArgumentParser, what: str) -> None:
    s.add_argument("--micro-batches", type=int, default=MICRO_BATCHES, help=f"{what} (default %(default)s)")


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
