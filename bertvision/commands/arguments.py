"""How a command is declared: its stage function and one flag per stage parameter, each saying
how its text becomes that value (a path, a number, a registered task, a stage's typed settings,
JSON). The parser, the help text and the call are made from the declaration, so that a stage is
one hop from its rule.

Conversions that can fail on a user's input (a task name, settings JSON) run when the command
runs, not while parsing, so that they end in one line naming the flag (``commands.main``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertvision.commands.stages import stage_of
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


def feature_source_arg(text: str):
    from bertvision.features.source import feature_source

    return feature_source(text)


@dataclass(frozen=True)
class Arg:
    """One flag, ``--name`` for the stage parameter ``name`` it fills: ``help``; argparse's ``type``,
    ``nargs``, ``choices`` and ``metavar``. An optional flag left out passes nothing, so that the
    stage's own default holds, unless it has a ``default`` (shown in --help)."""

    help: str = ""
    type: Callable = str
    nargs: str | None = None
    required: bool = True
    default: Any = None
    metavar: str | None = None
    choices: tuple | None = None
    positional: bool = False

    def but(self, **changes) -> Arg:
        return dataclasses.replace(self, **changes)

    def add(self, parser: argparse.ArgumentParser, name: str) -> None:
        kwargs = {"type": self.type, "nargs": self.nargs, "choices": self.choices, "metavar": self.metavar}
        if self.positional:
            parser.add_argument(name, help=self.help, **kwargs)
            return
        help = self.help
        if self.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = self.default
            if self.default is not None and not isinstance(self.default, (list, dict)):
                help = f"{help} (default %(default)s)".lstrip()
        parser.add_argument(self.flag_name(name), dest=name, help=help, **kwargs)

    @staticmethod
    def flag_name(name: str) -> str:
        return "--" + name.replace("_", "-")

    def value(self, given: Any, flag: str) -> Any:
        return given


def path(help: str = "", **kw) -> Arg:
    return Arg(help, type=Path, **kw)


def paths(help: str = "", required: bool = True, **kw) -> Arg:
    """Several paths; optional ones may be none at all."""
    return Arg(help, type=Path, nargs="+" if required else "*", required=required, default=[], **kw)


@dataclass(frozen=True)
class Task(Arg):
    """A registered task, by name; an unknown one is one error line naming the flag."""

    def value(self, given, flag):
        from bertvision.registry.tasks import get_task

        try:
            return get_task(given)
        except KeyError as err:
            raise SettingsError(f"{flag}: {err.args[0]}") from None


@dataclass(frozen=True)
class Settings(Arg):
    """A stage's typed settings as JSON (``cls``); the command's help lists every key."""

    cls: type = object
    metavar: str = "JSON"

    def add(self, parser, name):
        super().add(parser, name)
        epilog = f"{self.flag_name(name)}: {self.cls.describe()}"
        parser.epilog = f"{parser.epilog}\n\n{epilog}" if parser.epilog else epilog

    def value(self, given, flag):
        return self.cls.from_json(given, flag)


def settings(cls) -> Settings:
    return Settings(f"the stage's {cls.__name__} (see below)", cls=cls)


@dataclass(frozen=True)
class NamedSettings(Settings):
    """A JSON object of name -> a stage's typed settings (``cls``), as a dict."""

    def value(self, given, flag):
        try:
            named = json.loads(given)
        except json.JSONDecodeError as err:
            raise SettingsError(f"{flag}: not valid JSON ({err})") from None
        if not isinstance(named, dict):
            raise SettingsError(f"{flag}: expected a JSON object of name -> {self.cls.__name__}")
        return {name: self.cls.from_dict(value, f"{flag} {name}") for name, value in named.items()}


@dataclass(frozen=True)
class NamePaths(Arg):
    """NAME=PATH pairs, as a dict."""

    type: Callable = name_path_arg
    nargs: str | None = "+"

    def value(self, given, flag):
        return dict(given)


@dataclass(frozen=True)
class Switch(Arg):
    """A flag that is on when given."""

    required: bool = False

    def add(self, parser, name):
        parser.add_argument(self.flag_name(name), dest=name, action="store_true", help=self.help)


@dataclass(frozen=True)
class MicroBatches(Arg):
    """Per-device micro-batches; the default is MICRO_BATCHES's, read when the parser is built."""

    required: bool = False

    def add(self, parser, name):
        help = f"{self.help} (default %(default)s)"
        parser.add_argument(self.flag_name(name), dest=name, type=int, default=MICRO_BATCHES, help=help)


TASK, PATH, PATHS, INT = Task(), path(), paths(), Arg(type=int)
OPTIONAL_PATHS = paths(required=False)
THREADS = Arg("torch threads", type=int, required=False)


@dataclass(frozen=True)
class Command:
    """A command: its stage function (``commands.stages.stage_of``, imported when it runs, so that
    `bertvision --help` stays light), called with each flag's value as the parameter it names; ``adapt`` turns the
    values into the stage's parameters where they differ (a task's splits, a settings field);
    ``out_of_memory``, a GPU stage that a resubmission retries with smaller micro-batches.
    ``args`` may be a function, for flags whose defaults are read when the parser is built."""

    name: str
    help: str
    args: dict[str, Arg] | Callable[[], dict[str, Arg]]
    adapt: Callable[[dict], dict] | None = None
    out_of_memory: bool = False

    def arguments(self) -> dict[str, Arg]:
        return self.args() if callable(self.args) else self.args

    def add_to(self, sub) -> argparse.ArgumentParser:
        formatter = argparse.RawDescriptionHelpFormatter
        parser = sub.add_parser(self.name, help=self.help, description=self.help, formatter_class=formatter)
        for name, arg in self.arguments().items():
            arg.add(parser, name)
        parser.set_defaults(command=self)
        return parser

    def function(self) -> Callable:
        return stage_of(self.name)

    def run(self, namespace: argparse.Namespace) -> Any:
        values = {
            name: arg.value(getattr(namespace, name), arg.flag_name(name))
            for name, arg in self.arguments().items()
            if arg.required or getattr(namespace, name) is not None
        }
        if self.adapt:
            values = self.adapt(values)
        micro_batches = values.get("micro_batches", MICRO_BATCHES)
        guard = retry_on_out_of_memory(self.name, micro_batches) if self.out_of_memory else contextlib.nullcontext()
        with guard:
            return self.function()(**values)


def command(name: str, help: str, adapt=None, out_of_memory: bool = False, **args: Arg) -> Command:
    """A command whose flags are keyword arguments, in order: ``command("x", help, task=TASK, out=PATH)``."""
    return Command(name, help, args, adapt, out_of_memory)


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
