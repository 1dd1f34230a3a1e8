"""Typed settings, one pydantic model per stage. ``config.workflow.WorkflowSettings`` builds them
once from the validated config; the rules pass them to the stages as JSON (so a changed setting
reruns exactly the jobs that read it), and the stages parse that JSON back with the same model,
strictly: every key present, no unknown key, no bool for a number, no string for an int. No
defaults here: every value comes from the config, whose defaults live in the schema. Each field
names the config key it comes from; its help text is that key's default and description.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bertvision.config.schema import documented_default, schema_node
from bertvision.errors import ConfigError, SettingsError

# A JSON number: an int or a float, kept as given (so the JSON of a config's settings, and the
# jobs it keys, stay what the config says); never a bool.
Number = int | float
# A JSON list; its items keep the model's strict types.
Numbers = Annotated[tuple[float, ...], Field(strict=False)]
Names = Annotated[tuple[str, ...], Field(strict=False)]

EXPECTED = {
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "string_type": "str",
    "dict_type": "an object",
    "tuple_type": "a list",
}


def setting(config_key: str) -> Any:
    """A required field set from ``config_key`` (``<task>``: the global value, overridable per task)."""
    return Field(json_schema_extra={"config": config_key})


class StageSettings(BaseModel):
    """A stage's settings: frozen, every field required, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    @classmethod
    def from_json(cls, text: str, source: str = "--settings"):
        """The settings a command-line flag (``source``) gives as JSON; SettingsError names the flag and the keys."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise SettingsError(cls._problems(err, source)) from None

    @classmethod
    def from_dict(cls, data: Any, source: str = "--settings"):
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise SettingsError(cls._problems(err, source)) from None

    @classmethod
    def pick(cls, section: dict, source: str = "config", **given):
        """The fields from a validated config ``section`` whose keys they share, plus ``given``."""
        try:
            return cls.model_validate({**{k: section[k] for k in cls.keys() if k not in given}, **given})
        except ValidationError as err:
            raise ConfigError(cls._problems(err, source, by_config_key=True)) from None

    @classmethod
    def keys(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def config_key(cls, name: str) -> str | None:
        return (cls.model_fields[name].json_schema_extra or {}).get("config")

    def to_dict(self) -> dict:
        return self.model_dump()

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    def replace(self, **changes):
        """A copy with ``changes``, validated like the original."""
        return type(self).model_validate({**self.model_dump(), **changes})

    @classmethod
    def describe(cls) -> str:
        """Help text: each key with the config key that sets it, that key's default and its
        description, all from the schema."""
        lines = []
        for name in cls.keys():
            key = cls.config_key(name)
            where = [f"config {key}"] if key else []
            with contextlib.suppress(KeyError):
                where.append(f"default {json.dumps(documented_default(key))}")
            text = (schema_node(key) if key else {}).get("description", "").strip()
            lines.append(f"  {name}" + (f" ({', '.join(where)})" if where else "") + (f": {text}" if text else ""))
        return f"JSON object ({cls.__name__}) with keys:\n" + "\n".join(lines)

    @classmethod
    def _problems(cls, err: ValidationError, source: str, by_config_key: bool = False) -> str:
        """pydantic's errors as one line: the unknown and missing keys, then each value of the wrong type."""
        errors = err.errors()
        if errors[0]["type"] == "json_invalid":
            return f"{source}: not valid JSON ({errors[0]['ctx']['error']})"
        if errors[0]["type"] == "model_type":
            return f"{source}: expected a JSON object of {cls.__name__} ({', '.join(cls.keys())})"
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        missing = [str(e["loc"][0]) for e in errors if e["type"] == "missing"]  # in field order
        keys = [f"{what} key(s) {names}" for what, names in (("unknown", unknown), ("missing", missing)) if names]
        wrong: dict[str, tuple[list[str], Any]] = {}  # where -> (what was expected, the value)
        for e in errors:
            if e["type"] not in ("extra_forbidden", "missing"):
                # loc: the field, list positions, and the member tags of a union (int | float)
                field, rest = str(e["loc"][0]), e["loc"][1:]
                where = field + "".join(f"[{p}]" for p in rest if isinstance(p, int))
                if by_config_key and cls.config_key(field):
                    where = f"{where} (config {cls.config_key(field)})"
                wrong.setdefault(where, ([], e["input"]))[0].append(EXPECTED.get(e["type"], e["msg"].lower()))
        expected = lambda what: "a number" if sorted(what) == ["float", "int"] else " or ".join(what)  # noqa: E731
        problems = ([f"{cls.__name__} " + "; ".join(keys)] if keys else []) + [
            f"{where}: expected {expected(what)}, got {value!r}" for where, (what, value) in wrong.items()
        ]
        return f"{source}: " + "; ".join(problems)


class DownloadSettings(StageSettings):
    source: str = setting("data.source")
    glue_dir: str = setting("data.glue_dir")
    squad_dir: str = setting("data.squad_dir")
    hub_repo: str | None = setting("data.hub_repo")
    seed: int = setting("data.seed")
    selection_fraction: Number = setting("data.selection_fraction")
    train_size: int | None = setting("tasks.<task>.train_size")
    selection_size: int | None = setting("tasks.<task>.selection_size")
    eval_size: int | None = setting("tasks.<task>.eval_size")
    article_split: dict | None = setting("tasks.<task>.article_split")


class TokenizeSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    max_length: int = setting("tasks.<task>.max_length")
    doc_stride: int | None = setting("tasks.<task>.doc_stride")  # span tasks only


class FinetuneCompute(StageSettings):
    """Where fine-tuning runs, and in which precision."""

    device: str = setting("finetune.device")
    precision: str = setting("finetune.precision")


class ExtractCompute(StageSettings):
    """Where extraction runs, and in which precision."""

    device: str = setting("extract.device")
    precision: str = setting("extract.precision")


class FinetuneSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epoch_fractions: Numbers = setting("finetune.epoch_fractions")
    learning_rate: Number = setting("finetune.settings.learning_rate")
    batch_size: int = setting("finetune.settings.batch_size")
    eval_batch_size: int = setting("finetune.settings.eval_batch_size")
    warmup_ratio: Number = setting("finetune.settings.warmup_ratio")
    weight_decay: Number = setting("finetune.settings.weight_decay")
    max_grad_norm: Number = setting("finetune.settings.max_grad_norm")
    schedule_epochs: Number | None = setting("finetune.settings.schedule_epochs")


class BaselineSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epochs: int = setting("baseline.epochs")
    learning_rate: Number = setting("baseline.settings.learning_rate")
    batch_size: int = setting("baseline.settings.batch_size")
    eval_batch_size: int = setting("baseline.settings.eval_batch_size")
    warmup_ratio: Number = setting("baseline.settings.warmup_ratio")
    weight_decay: Number = setting("baseline.settings.weight_decay")
    max_grad_norm: Number = setting("baseline.settings.max_grad_norm")


class MixtureSettings(StageSettings):
    """Fine-tuning one encoder on several tasks at once (a shared encoder of ``shared.mixtures``)."""

    backbone: str = setting("backbones.<model>.pretrained")
    tasks: Names = setting("shared.mixtures.<name>.tasks")
    epochs: float = setting("shared.mixtures.<name>.epochs")
    learning_rate: Number = setting("finetune.settings.learning_rate")
    batch_size: int = setting("finetune.settings.batch_size")
    eval_batch_size: int = setting("finetune.settings.eval_batch_size")
    warmup_ratio: Number = setting("finetune.settings.warmup_ratio")
    weight_decay: Number = setting("finetune.settings.weight_decay")
    max_grad_norm: Number = setting("finetune.settings.max_grad_norm")


class ExtractSettings(StageSettings):
    batch_size: int = setting("extract.batch_size")
    block_rows: int = setting("extract.block_rows")
    block_tokens: int = setting("extract.block_tokens")


class HeadTrainingSettings(StageSettings):
    learning_rate: Number = setting("heads.training.learning_rate")
    batch_size: int = setting("heads.training.batch_size")
    max_epochs: int = setting("heads.training.max_epochs")
    patience: int = setting("heads.training.patience")
    weight_decay: Number = setting("heads.training.weight_decay")
    warmup_ratio: Number = setting("heads.training.warmup_ratio")
    in_memory_max_mb: Number = setting("heads.training.in_memory_max_mb")
    standardize: bool = setting("heads.training.standardize")


class HeadRuntimeSettings(StageSettings):
    """Where heads train and how their feature shards are checked."""

    device: str = setting("heads.device")
    verify: str = setting("heads.verify")


class SearchSettings(StageSettings):
    trials: int = setting("search.trials")
    workers: int = setting("search.workers")
    seed: int = setting("search.seed")
    startup_trials: int = setting("search.startup_trials")
    pruner: dict = setting("search.pruner")
    space: dict = setting("search.space")
    head_seed: int = setting("heads.seeds")  # trials train with the first head seed
