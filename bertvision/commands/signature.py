"""A command made from its stage's signature: one flag ``--a-name`` per parameter ``a_name``, its
form read from the annotation (a path, a number, a registered task, a stage's typed settings as
JSON, NAME=PATH pairs, a dataclass's fields as flags of their own) and its default from the
stage's; its help from ``HELP``, one text per parameter name in every command. Written by hand,
not with jsonargparse: a task name, settings JSON or a checkpoint is converted when the command
runs, so that a bad one ends in the one line naming its flag that every command prints
(``commands.main``), and the settings' help lists each key with the config key that sets it."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bertvision.config.stage_settings import StageSettings
from bertvision.errors import SettingsError

HELP = {
    "task": "a registered task",
    "host": "the address to listen on (0.0.0.0: every interface)",
    "port": "the TCP port to listen on",
    "source": "the task whose heads are applied",
    "target": "the task they are applied to",
    "model_name": "the backbone's name in the config (recorded with the results)",
    "encoder_name": "the mixture's name in the config (recorded)",
    "raw_dir": "the task's canonical splits",
    "raw_dirs": "every task's canonical splits (rule download), whose record says which rows repeat a train row",
    "tokens_dir": "the task's token ids",
    "tokens_dirs": "TASK=DIR, every mixed task",
    "checkpoint": "the checkpoint (epoch fraction)",
    "checkpoint_dir": "the checkpoint's directory",
    "previous": "the checkpoint before this one, which fine-tuning goes on from",
    "optimizer_state": "keep AdamW's state for a later checkpoint to go on from, or drop it (the last checkpoint)",
    "previous_decision": "the race's decision at the checkpoint before this one",
    "splits": "the task's splits",
    "scored_splits": "the splits BERT's own head is scored on",
    "shard_dirs": "a checkpoint's extraction shards, in shard order",
    "attrs": "where the features come from (stored in each shard)",
    "keep_bert_logits": "run the task model and keep BERT's outputs on the scored splits beside the states",
    "bert_logits": "BERT's outputs on the scored splits, for the head + BERT ensembles",
    "manifest": "the feature manifest, or a stream source (JSON) for store: false",
    "manifests": "feature manifests",
    "heads": "the heads to train: name -> HeadSettings",
    "head_names": "the heads to apply, by name",
    "task_heads": "task -> the names of the heads trained on the shared encoders",
    "task_head_dirs": "TASK=DIR: a task's train_heads output on this encoder (a task may repeat)",
    "seeds": "head seeds",
    "seed": "the fine-tuning seed",
    "micro_batches": "split each batch into this many micro-batches",
    "threads": "torch threads",
    "devices": "the devices to run replicas on (default: every GPU, else the CPU)",
    "searched": "HEAD=best.json: train HEAD with its search's best parameters",
    "train_fraction": "train on this nested share of the rows",
    "survivors_from": "the first fine-tuning seed's train_heads output here: train only the heads its race kept",
    "finish": "heads the race never stops (another experiment reads their runs: the shared encoders' heads)",
    "head_dirs": "train_heads outputs",
    "head_dir": "a train_heads output",
    "last": "this is the last configured checkpoint",
    "in_memory_max_mb": "MiB of features held in memory (heads.training.in_memory_max_mb)",
    "embeddings": "the task's sentence embeddings (rule embed), for a peer that trains no encoder",
    "keys": "JSON: the study's keys (model, task, ftseed, checkpoint, head)",
    "provenance": "JSON: what the bundle index records of where it came from",
    "storage": "journal file path or RDB URL",
    "worker": "this worker's number",
    "worker_records": "the study's worker records",
    "peers": "task -> the peers the config names for it, as JSON",
    "runs": "JSON: every run, [{model, task, ftseed, checkpoint}]",
    "checkpoint_runs": "JSON: every checkpoint, [{task, ftseed, checkpoint, checkpoint_dir, heads_dir}]",
    "n_shards": "extraction shards per checkpoint",
    "shard": "this shard's number",
    "head_order": "head names in table order",
    "result_csvs": "glue.csv / squad.csv",
    "summary_csv": "summary.csv",
    "methods_csv": "methods.csv",
    "tasks": "task names",
    "baseline_metrics": "full fine-tuning records",
    "table_csv": "the table to plot",
    "plot": "the heatmap to write",
    "encoders": "the shared encoders, [{name, kind, ...}]",
    "models": "backbone names",
    "ft_seeds": "fine-tuning seeds",
    "epochs": '{"mixture": epochs, ...}',
    "encoder_dir": "a checkpoint (model.safetensors + config.json)",
    "tokenizer": "the backbone reference (backbones.<model>.pretrained)",
    "task_settings": '{"task": {"max_length": N, "doc_stride": N}}: the tokenization the features used',
    "precision": "extract.precision of the features (serving reproduces it)",
    "picks": "the tables stage's picks record (results/tables/picks.json)",
    "backbone": "the backbone whose picks to serve",
    "bundles": "bundle directories, or sets of them (serve-bundles' output)",
    "workers": "uvicorn worker processes",
    "max_batch_size": "inputs per encoder pass",
    "max_wait_ms": "how long a batch waits to fill",
    "max_texts": "inputs per request",
    "max_body_bytes": "request body size",
    "max_text_chars": "characters per text, question or context",
    "max_windows": "context windows per question",
    "max_batch_tokens": "padded tokens per encoder forward call",
    "max_queued": "requests waiting per encoder; more get 503",
    "max_chunk_rows": "sequences per encoder forward call, sorted by length (0: the whole batch in one)",
    "pad_multiple": "pad each forward call's width to a multiple of this",
    "device": "auto: a GPU when there is one",
    "backend": "the encoder's runtime (default: the one each bundle's heads were trained on)",
    "configs": "config files, each over the ones before (as snakemake --configfile A B merges them)",
    "show": "print the effective config, every default filled in",
    "dir": "the working directory",
    "out": "the file to write",
    "out_dir": "the folder to write into",
    "bert_metrics": "BERT's own head's records at every checkpoint (rule score_bert)",
    "search_workers": "every search worker's record (its job's time is part of a pick's whole cost)",
    "race_decisions": "the race's decision at every checkpoint it reached",
    "peer_metrics": "every peer run's record (rule peer)",
    "best_files": "every search's best parameters (rule search_best)",
    "subset_dirs": "train_heads_subset outputs (heads trained on nested shares of the rows)",
    "transfer_files": "every transfer record (heads applied to another checkpoint or task)",
    "curve_files": "BERT's fine-tuning curve records (rule bert_curve)",
}


def to_json(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SettingsError(f"{flag}: not valid JSON ({err})") from None


def json_of(kind: Any) -> Callable[[str, str], Any]:
    """JSON of the shape ``kind`` (a dict or list, or one of dicts) names: another shape is one line,
    not a traceback where the stage first reads it."""
    origin, args = typing.get_origin(kind) or kind, typing.get_args(kind)
    element = (typing.get_origin(args[-1]) or args[-1]) if args else None

    def convert(text: str, flag: str) -> Any:
        value = to_json(text, flag)
        if not isinstance(value, origin):
            raise SettingsError(f"{flag}: expected a JSON {'object' if origin is dict else 'list'}, got {text!r}")
        items = value.values() if origin is dict else value
        if element in (dict, list) and not all(isinstance(item, element) for item in items):
            raise SettingsError(f"{flag}: expected each item a JSON {'object' if element is dict else 'list'}")
        return value

    return convert


def records_of(cls: type) -> Callable[[str, str], list]:
    """A JSON list of ``cls`` records (``cls.from_json``), each checked as it is read."""

    def convert(text: str, flag: str) -> list:
        records = json_of(list)(text, flag)
        try:
            return [cls.from_json(record) for record in records]
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            problem = f"missing key {err}" if isinstance(err, KeyError) else str(err)
            raise SettingsError(f"{flag}: not a list of {cls.__name__} records ({problem})") from None

    return convert


def name_path(text: str, flag: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SettingsError(f"{flag}: expected NAME=PATH, got {text!r}")
    return name, Path(path)


def named_settings(cls: type[StageSettings]) -> Callable:
    def convert(text: str, flag: str) -> dict:
        named = to_json(text, flag)
        if not isinstance(named, dict):
            raise SettingsError(f"{flag}: expected a JSON object of name -> {cls.__name__}")
        return {name: cls.from_dict(value, f"{flag} {name}") for name, value in named.items()}

    return convert


def registered_task(name: str, flag: str):
    from bertvision.registry.tasks import get_task

    try:
        return get_task(name)
    except KeyError as err:
        raise SettingsError(f"{flag}: {err.args[0]}") from None


def checkpoint(text: str, flag: str):
    from bertvision.layout import Checkpoint

    try:
        return Checkpoint.named(text)
    except ValueError:
        raise SettingsError(f"{flag}: expected an epoch fraction, got {text!r}") from None


def source(text: str, flag: str):
    from bertvision.features.source import feature_source

    try:
        return feature_source(text)
    except (ValueError, KeyError, TypeError) as err:
        raise SettingsError(f"{flag}: not a stream source ({type(err).__name__}: {err})") from None


@dataclass(frozen=True)
class Flag:
    """One parameter's flag: argparse's keywords, and ``convert(text, flag)``, run on each given
    text when the command runs (``as_dict``: NAME=PATH pairs into a dict). ``fields``: a dataclass
    parameter, one flag per field; ``settings``: the stage settings whose keys the help lists."""

    name: str
    options: dict
    convert: Callable[[str, str], Any] | None = None
    default: Any = inspect.Parameter.empty
    as_dict: bool = False
    fields: tuple[Flag, ...] = ()
    cls: type | None = None
    settings: type[StageSettings] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def add(self, parser: argparse.ArgumentParser, positional: bool = False) -> None:
        for field in self.fields:
            field.add(parser)
        if self.fields:
            return
        options, help = dict(self.options), HELP.get(self.name, "")
        if self.settings:
            help = f"{help or 'the stage settings'}: a JSON {self.settings.__name__} (keys below)"
        if positional:
            if options.get("nargs") == "*":  # a bare list takes one value at least: none is a usage error, not "."
                options["nargs"] = "+"
            parser.add_argument(self.name, help=help, **options)
            return
        if self.default is inspect.Parameter.empty:
            options["required"] = True
        else:
            options["default"] = self.default
            if options.get("action") != "store_true" and not isinstance(self.default, (type(None), list, tuple, dict)):
                help = f"{help} (default %(default)s)".lstrip()
        parser.add_argument(self.flag, dest=self.name, help=help, **options)

    def value(self, namespace: argparse.Namespace) -> Any:
        if self.fields:
            return self.cls(**{field.name: field.value(namespace) for field in self.fields})
        given = getattr(namespace, self.name)
        if self.convert is None or given is self.default:
            return given
        if not self.options.get("nargs"):
            return self.convert(given, self.flag)
        converted = [self.convert(each, self.flag) for each in given]
        return dict(converted) if self.as_dict else converted


def members(kind: Any) -> list:
    """The types of a union, None left out; else ``[kind]``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [k for k in typing.get_args(kind) if k is not type(None)]
    return [kind]


def flag_of(name: str, kind: Any, default: Any = inspect.Parameter.empty) -> Flag:
    """The flag of a parameter ``name`` annotated ``kind``, with ``default`` (``empty``: required)."""
    from bertvision.features.source import StreamSource
    from bertvision.layout import Checkpoint
    from bertvision.registry.task_spec import TaskSpec

    kinds = members(kind)
    if StreamSource in kinds:
        return Flag(name, {"metavar": "MANIFEST|SOURCE_JSON"}, source, default)
    (kind,) = kinds
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    many = {"nargs": "*"}  # a list may be empty (a rule's inputs that a config leaves out); the flag is still required
    if origin is list and StreamSource in members(args[0]):
        return Flag(name, {"metavar": "MANIFEST|SOURCE_JSON", **many}, source, default)
    if kind is bool:
        return Flag(name, {"action": "store_true"}, default=False)
    if origin is Literal:
        return Flag(name, {"choices": args}, default=default)
    if kind in (int, float, str, Path):  # an optional one may be given empty (a rule's input that is not there)
        return Flag(name, {"type": kind, **({"nargs": "?"} if default is None else {})}, default=default)
    if origin in (list, tuple) and args[0] in (int, float, str, Path):
        return Flag(name, {"type": args[0], **many}, default=default)
    if kind is TaskSpec:
        return Flag(name, {}, registered_task, default)
    if kind is Checkpoint:
        return Flag(name, {}, checkpoint, default)
    if isinstance(kind, type) and issubclass(kind, StageSettings):
        return Flag(name, {"metavar": "JSON"}, kind.from_json, default, settings=kind)
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], StageSettings):
        return Flag(name, {"metavar": "JSON"}, named_settings(args[1]), default, settings=args[1])
    if kind in (dict[str, Path], list[tuple[str, Path]]):
        return Flag(name, {"metavar": "NAME=PATH", **many}, name_path, default, as_dict=origin is dict)
    if origin is list and hasattr(args[0], "from_json"):
        return Flag(name, {"metavar": "JSON"}, records_of(args[0]), default)
    if dataclasses.is_dataclass(kind):
        hints, instance = typing.get_type_hints(kind), kind() if default is inspect.Parameter.empty else default
        fields = tuple(flag_of(f.name, hints[f.name], getattr(instance, f.name)) for f in dataclasses.fields(kind))
        return Flag(name, {}, default=default, fields=fields, cls=kind)
    if kind in (dict, list) or origin in (dict, list):
        return Flag(name, {"metavar": "JSON"}, json_of(kind), default)
    raise TypeError(f"{name}: no command-line form for {kind!r}")


def flags_of(function: Callable) -> list[Flag]:
    """Every parameter of ``function`` as a flag, in order."""
    hints = typing.get_type_hints(function)
    return [flag_of(name, hints[name], p.default) for name, p in inspect.signature(function).parameters.items()]


def parser_of(name: str, help: str, function: Callable, positional: str | None = None) -> argparse.ArgumentParser:
    """``bertvision NAME``'s parser: a flag per parameter of ``function``, ``positional`` given bare;
    the help ends with each settings parameter's keys."""
    parser = argparse.ArgumentParser(
        prog=f"bertvision {name}", description=help, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    epilog = []
    for flag in flags_of(function):
        flag.add(parser, flag.name == positional)
        if flag.settings:
            epilog.append(f"{flag.flag}: {flag.settings.describe()}")
    parser.epilog = "\n\n".join(epilog) or None
    return parser


def call(function: Callable, namespace: argparse.Namespace) -> Any:
    """``function`` with each flag's value as the parameter it names."""
    return function(**{flag.name: flag.value(namespace) for flag in flags_of(function)})
