"""What the helper scripts (``scripts/``) share: bad input is one line, ``<script>: error: ...``, and
exit status 2, never a traceback; a run's directory is checked for the pieces a script reads
before it reads them; a run of a config that declares its own tasks is read with that config
(``--config``), which declares them in this process as the workflow did."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from bertvision.errors import BertvisionError
from bertvision.layout import Checkpoint
from bertvision.registry.task_spec import TaskSpec
from bertvision.registry.tasks import TASKS, get_task

USAGE_ERROR = 2


class ScriptError(BertvisionError):
    """Input a script cannot use (a run directory, a flag's value): the message names it."""


def run_script(main: Callable[[], int | None]) -> None:
    """Run a script's ``main`` and exit with its status; the package's errors (a bad config, a
    missing run piece) and a missing file print as one line and exit with status 2."""
    prog = Path(sys.argv[0]).name
    try:
        status = main()
    except BertvisionError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        status = USAGE_ERROR
    except FileNotFoundError as err:
        print(f"{prog}: error: {err.filename or err}: no such file or directory", file=sys.stderr)
        status = USAGE_ERROR
    sys.exit(status or 0)


def run_directory(path: Path, *pieces: str) -> Path:
    """``path``, a run's working directory holding something at each of ``pieces`` (glob patterns
    relative to it): a missing directory or piece is a ScriptError naming it."""
    if not path.is_dir():
        raise ScriptError(f"{path}: no such run directory")
    for piece in pieces:
        if next(path.glob(piece), None) is None:
            raise ScriptError(f"{path}: no {piece} (not a finished run, or not a run's directory?)")
    return path


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="the run's config files (a config and its overlays, as given to snakemake): read for the tasks they "
        "declare (tasks.<name>.files or .hub), whose files are relative to the run's directory",
    )


def declare_config_tasks(config_files: list[Path] | None, run_dir: Path):
    """The WorkflowSettings of a run's config files (None without any): reading them declares
    their own tasks in this process. A declared task's files are read from the run's directory, as
    the workflow read them (``snakemake --directory``)."""
    from bertvision.config.workflow import WorkflowSettings

    if not config_files:
        return None
    paths = [path.resolve() for path in config_files]
    missing = [str(given) for given, path in zip(config_files, paths) if not path.is_file()]
    if missing:
        raise ScriptError(f"--config: {', '.join(missing)}: no such file")
    with contextlib.chdir(run_dir):
        return WorkflowSettings.from_files(paths)


def one_backbone(records: list[dict], run_dir: Path) -> None:
    """A ScriptError where ``records`` (head records, by ``source.model``) come from several
    backbones: the scripts that call this key their tables by task, checkpoint and head alone."""
    found = sorted({r["source"]["model"] for r in records})
    if len(found) > 1:
        raise ScriptError(f"{run_dir}: head records of several backbones ({', '.join(found)}); give one backbone's run")


def known_task(name: str) -> TaskSpec:
    """The task ``name``; one the registry does not hold (a config's own task) says to pass --config."""
    try:
        return get_task(name)
    except KeyError:
        raise ScriptError(
            f"unknown task {name!r} (the registry has {', '.join(sorted(TASKS))}); for a task the run's config "
            "declares, pass the run's config files with --config FILE [FILE ...]"
        ) from None


def checkpoint_argument(value: str) -> Checkpoint:
    """An argparse type: a checkpoint's name (0, 0.3, 1)."""
    try:
        return Checkpoint.named(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a checkpoint (an epoch fraction: 0, 0.3, 1)") from None
