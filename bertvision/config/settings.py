"""Typed settings, one class per stage. ``config.workflow.WorkflowSettings`` builds them once
from the validated config; the rules pass them to the stages as JSON (so a changed setting
reruns exactly the jobs that read it), and the stages read them back strictly. No defaults
here: every value comes from the config, whose defaults live in the schema. Each field names
the config key it comes from, and its help text is that key's schema description.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field

from bertvision.config.schema import schema_node
from bertvision.errors import SettingsError


def setting(config_key: str):
    """A field set from ``config_key`` (``<task>``: the global value, overridable per task)."""
    return field(metadata={"config": config_key})


class StageSettings:
    """Strict JSON round trip: every field present, no unknown key, values of the field's type."""

    @classmethod
    def from_dict(cls, data: dict, source: str = "--settings"):
        if not isinstance(data, dict):
            raise SettingsError(f"{source}: expected a JSON object of {cls.__name__} ({', '.join(cls.keys())})")
        unknown = sorted(set(data) - set(cls.keys()))
        missing = [k for k in cls.keys() if k not in data]
        problems = [f"{what} key(s) {keys}" for what, keys in (("unknown", unknown), ("missing", missing)) if keys]
        if problems:
            raise SettingsError(f"{source}: {cls.__name__} " + "; ".join(problems))
        hints = typing.get_type_hints(cls)
        return cls(**{k: _typed(data[k], hints[k], f"{source}: {k}") for k in cls.keys()})

    @classmethod
    def pick(cls, section: dict, **given):
        """The fields from a validated config ``section`` whose keys they share, plus ``given``."""
        return cls(**{k: section[k] for k in cls.keys() if k not in given}, **given)

    @classmethod
    def from_json(cls, text: str, source: str = "--settings"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SettingsError(f"{source}: not valid JSON ({err})") from None
        return cls.from_dict(data, source)

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    @classmethod
    def describe(cls) -> str:
        """Help text: each key with the config key that sets it and that key's description."""
        lines = []
        for f in dataclasses.fields(cls):
            key = f.metadata.get("config")
            node = schema_node(key) if key else {}
            text = node.get("description", "").strip()
            lines.append(f"  {f.name}" + (f" (config {key})" if key else "") + (f": {text}" if text else ""))
        return f"JSON object ({cls.__name__}) with keys:\n" + "\n".join(lines)


def _typed(value, hint, where: str):
    """``value`` checked against a simple type hint (lists become tuples where a tuple is wanted)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        return _typed(value, next(o for o in options if o is not type(None)), where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{where}: expected a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_typed(v, item, where) for v in value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise SettingsError(f"{where}: expected an object, got {value!r}")
        return value
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[hint](value)
    if not ok:
        raise SettingsError(f"{where}: expected {hint.__name__}, got {value!r}")
    return float(value) if hint is float else value


@dataclass(frozen=True)
class DownloadSettings(StageSettings):
    source: str = setting("data.source")
    glue_dir: str = setting("data.glue_dir")
    squad_dir: str = setting("data.squad_dir")
    hub_repo: str | None = setting("data.hub_repo")
    seed: int = setting("data.seed")
    selection_fraction: float = setting("data.selection_fraction")
    train_size: int | None = setting("tasks.<task>.train_size")
    selection_size: int | None = setting("tasks.<task>.selection_size")
    eval_size: int | None = setting("tasks.<task>.eval_size")
    article_split: dict | None = setting("tasks.<task>.article_split")


@dataclass(frozen=True)
class TokenizeSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    max_length: int = setting("tasks.<task>.max_length")
    doc_stride: int | None = setting("tasks.<task>.doc_stride")  # span tasks only


@dataclass(frozen=True)
class FinetuneCompute(StageSettings):
    """Where fine-tuning runs, and in which precision."""

    device: str = setting("finetune.device")
    precision: str = setting("finetune.precision")


@dataclass(frozen=True)
class ExtractCompute(StageSettings):
    """Where extraction runs, and in which precision."""

    device: str = setting("extract.device")
    precision: str = setting("extract.precision")


@dataclass(frozen=True)
class FinetuneSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epoch_fractions: tuple[float, ...] = setting("finetune.epoch_fractions")
    learning_rate: float = setting("finetune.settings.learning_rate")
    batch_size: int = setting("finetune.settings.batch_size")
    eval_batch_size: int = setting("finetune.settings.eval_batch_size")
    warmup_ratio: float = setting("finetune.settings.warmup_ratio")
    weight_decay: float = setting("finetune.settings.weight_decay")
    max_grad_norm: float = setting("finetune.settings.max_grad_norm")
    schedule_epochs: float | None = setting("finetune.settings.schedule_epochs")


@dataclass(frozen=True)
class BaselineSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epochs: int = setting("baseline.epochs")
    learning_rate: float = setting("baseline.settings.learning_rate")
    batch_size: int = setting("baseline.settings.batch_size")
    eval_batch_size: int = setting("baseline.settings.eval_batch_size")
    warmup_ratio: float = setting("baseline.settings.warmup_ratio")
    weight_decay: float = setting("baseline.settings.weight_decay")
    max_grad_norm: float = setting("baseline.settings.max_grad_norm")


@dataclass(frozen=True)
class MixtureSettings(StageSettings):
    """Fine-tuning one encoder on several tasks at once (a shared encoder of ``shared.mixtures``)."""

    backbone: str = setting("backbones.<model>.pretrained")
    tasks: tuple[str, ...] = setting("shared.mixtures.<name>.tasks")
    epochs: float = setting("shared.mixtures.<name>.epochs")
    learning_rate: float = setting("finetune.settings.learning_rate")
    batch_size: int = setting("finetune.settings.batch_size")
    eval_batch_size: int = setting("finetune.settings.eval_batch_size")
    warmup_ratio: float = setting("finetune.settings.warmup_ratio")
    weight_decay: float = setting("finetune.settings.weight_decay")
    max_grad_norm: float = setting("finetune.settings.max_grad_norm")


@dataclass(frozen=True)
class ExtractSettings(StageSettings):
    batch_size: int = setting("extract.batch_size")
    block_rows: int = setting("extract.block_rows")
    block_tokens: int = setting("extract.block_tokens")


@dataclass(frozen=True)
class HeadTrainingSettings(StageSettings):
    learning_rate: float = setting("heads.training.learning_rate")
    batch_size: int = setting("heads.training.batch_size")
    max_epochs: int = setting("heads.training.max_epochs")
    patience: int = setting("heads.training.patience")
    weight_decay: float = setting("heads.training.weight_decay")
    warmup_ratio: float = setting("heads.training.warmup_ratio")
    in_memory_max_mb: float = setting("heads.training.in_memory_max_mb")
    standardize: bool = setting("heads.training.standardize")


@dataclass(frozen=True)
class HeadRuntimeSettings(StageSettings):
    """Where heads train and how their feature shards are checked."""

    device: str = setting("heads.device")
    verify: str = setting("heads.verify")


@dataclass(frozen=True)
class SearchSettings(StageSettings):
    trials: int = setting("search.trials")
    workers: int = setting("search.workers")
    seed: int = setting("search.seed")
    startup_trials: int = setting("search.startup_trials")
    pruner: dict = setting("search.pruner")
    space: dict = setting("search.space")
    head_seed: int = setting("heads.seeds")  # trials train with the first head seed
