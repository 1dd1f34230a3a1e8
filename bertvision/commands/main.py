"""Command line: one subcommand per workflow rule. Each takes explicit paths and its stage's
typed settings as JSON (what Snakemake's params track, so that a changed setting reruns exactly
the jobs that read it); ``bertvision COMMAND --help`` lists every settings key with the config
key that sets it. Known errors (a bad config key, data row or setting, a missing file, a full
disk) print one line each and exit with status 2."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import bertvision
from bertvision.commands import pipeline, serving
from bertvision.commands.arguments import Arg, Switch, command, path
from bertvision.errors import BertvisionError, DiskFullError
from bertvision.runtime.usage import log_usage

USAGE_ERROR = 2


HOUSEKEEPING = [
    command("validate-config", "check a config file against the schema and the registries",
            config=Arg(type=Path, positional=True), show=Switch("print the effective config, every default filled in")),
    command("clean", "remove every artifact folder of a working directory (bertvision.layout.ROOTS)",
            dir=path("the working directory", required=False, default=Path("."))),
]  # fmt: skip

# every command, in the order the pipeline runs them
COMMANDS = [*pipeline.COMMANDS, *serving.COMMANDS, *HOUSEKEEPING]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertvision", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {bertvision.__version__}")
    sub = p.add_subparsers(dest="command_name", required=True)
    for each in COMMANDS:
        each.add_to(sub)
    return p


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    try:
        args.command.run(args)
        log_usage(logging.getLogger("bertvision"))
    except BertvisionError as err:
        for line in str(err).splitlines():
            print(f"bertvision {args.command_name}: error: {line}", file=sys.stderr)
        if isinstance(err, DiskFullError):  # a file HDF5 cannot close: freeing it would crash the process
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(USAGE_ERROR)
        return USAGE_ERROR
    except FileNotFoundError as err:  # an input the command was pointed at is not there
        missing = err.filename or str(err)
        print(f"bertvision {args.command_name}: error: {missing}: no such file or directory", file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
