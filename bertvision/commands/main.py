"""Command line: one subcommand per workflow rule, its flags made from its stage's signature
(``commands.signature``). Each takes explicit paths and its stage's typed settings as JSON (what
Snakemake's params track, so that a changed setting reruns exactly the jobs that read it);
``bertvision COMMAND --help`` lists every settings key with the config key that sets it. Known
errors (a bad config key, data row or setting, a missing file, a full disk) print one line each
and exit with status 2."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

import bertvision
from bertvision.commands.signature import call, parser_of
from bertvision.commands.stages import COMMANDS, NOT_JOBS, POSITIONAL, stage_of
from bertvision.errors import BertvisionError, DiskFullError
from bertvision.runtime.usage import log_usage

USAGE_ERROR = 2


def command_parser(name: str, stage=None) -> argparse.ArgumentParser:
    """The parser of command ``name``, made from its stage's signature (``stage``: already imported)."""
    return parser_of(name, COMMANDS[name], stage or stage_of(name), POSITIONAL.get(name))


def list_commands(argv: list[str]) -> None:
    """``bertvision --help``, ``--version``, or a usage error: the command names, no stage imported."""
    parser = argparse.ArgumentParser(prog="bertvision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {bertvision.__version__}")
    sub = parser.add_subparsers(dest="command_name", required=True)
    for name, help in COMMANDS.items():
        sub.add_parser(name, help=help)
    parser.parse_args(argv)


PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        list_commands(argv)
    name, stage = argv[0], stage_of(argv[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = command_parser(name, stage).parse_args(argv[1:])
    try:
        with retry_on_out_of_memory(name, args) if hasattr(args, "micro_batches") else contextlib.nullcontext():
            call(stage, args)
        if name not in NOT_JOBS:
            log_usage(logging.getLogger("bertvision"))
    except BertvisionError as err:
        for line in str(err).splitlines():
            print(f"bertvision {name}: error: {line}", file=sys.stderr)
        if isinstance(err, DiskFullError):  # a file HDF5 cannot close: freeing it would crash the process
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(USAGE_ERROR)
        return USAGE_ERROR
    except PATH_ERRORS as err:  # a path the command was pointed at is not there, or not what it needs
        problem = "no such file or directory" if isinstance(err, FileNotFoundError) else str(err.strerror).lower()
        print(f"bertvision {name}: error: {err.filename or err}: {problem}", file=sys.stderr)
        return USAGE_ERROR
    return 0


@contextlib.contextmanager
def retry_on_out_of_memory(stage: str, args: argparse.Namespace):
    """A stage that splits its batches (``micro_batches``): a CUDA out-of-memory error becomes a clear
    message and exit status 3, so that a resubmission (Snakemake's ``--retries``) runs the next
    attempt with smaller per-device batches."""
    import torch

    from bertvision.runtime.device import OUT_OF_MEMORY_EXIT

    try:
        yield
    except torch.OutOfMemoryError as err:
        print(
            f"bertvision {stage}: CUDA out of memory with each batch split into {args.micro_batches} "
            f"micro-batch(es) ({err}). Run Snakemake with --retries N: attempt n splits each batch into "
            f"2^(n-1) micro-batches (the effective batch and the results stay the same) and asks for more "
            f"memory and time.",
            file=sys.stderr,
        )
        raise SystemExit(OUT_OF_MEMORY_EXIT) from err


if __name__ == "__main__":
    sys.exit(main())
