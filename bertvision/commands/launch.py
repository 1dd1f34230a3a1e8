"""The `bertvision` command: a job of a local Snakemake run is forked from the warm pool when one
answers (``runtime.warm``), else it runs here. This module imports nothing heavy, so that the
warm path starts in tens of milliseconds."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from bertvision.runtime.warm import run_in_pool

    code = run_in_pool(argv)
    if code is not None:
        return code
    from bertvision.commands.main import main as run_here

    return run_here(argv)


if __name__ == "__main__":
    sys.exit(main())
