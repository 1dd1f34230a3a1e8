"""Typed settings, one pydantic model per stage. ``config.workflow.WorkflowSettings`` builds them
once from the validated config; the rules pass them to the stages as JSON (so a changed setting
reruns exactly the jobs that read it), and the stages parse that JSON back with the same model,
strictly: every key present, no unknown key, no bool for a number, no string for an int. No
defaults here: every value comes from the config, whose defaults live in the schema. Each field
names the config key it comes from; its help text is that key's default and description.
"""

from __future__ import annotations

import contextlib
import functools
import json
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

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
    "model_type": "an object",
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
        """The fields from a validated config ``section`` whose keys they share, plus ``given``;
        a nested settings model takes its keys from the same ``section``."""
        try:
            return cls.model_validate({**cls._section_values(section, given), **given})
        except ValidationError as err:
            raise ConfigError(cls._problems(err, source, by_config_key=True)) from None

    @classmethod
    def _section_values(cls, section: dict, given=()) -> dict:
        return {
            name: nested._section_values(section) if (nested := cls.nested(name)) else section[name]
            for name in cls.keys()
            if name not in given
        }

    @classmethod
    def keys(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    @functools.cache  # planning a paper-scale run asks it about 100,000 times
    def nested(cls, name: str) -> type[StageSettings] | None:
        """The settings model of field ``name`` when it holds one."""
        kinds = [k for k in typing.get_args(cls.model_fields[name].annotation) if k is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else cls.model_fields[name].annotation  # X | None: X
        return kind if isinstance(kind, type) and issubclass(kind, StageSettings) else None

    @classmethod
    def config_key(cls, name: str, block: str | None = None) -> str | None:
        """The config key that sets field ``name``: its own, or, in a settings model nested in a
        field set from the config block ``block``, that block's key of the same name."""
        own = (cls.model_fields[name].json_schema_extra or {}).get("config")
        return own or (f"{block}.{name}" if block else None)

    @classmethod
    def config_keys(cls, prefix: str = "", block: str | None = None):
        """(key, config key) of every field, a nested model's keys dotted (``optimizer.batch_size``)."""
        for name in cls.keys():
            key = cls.config_key(name, block)
            if nested := cls.nested(name):
                yield from nested.config_keys(f"{prefix}{name}.", key)
            else:
                yield f"{prefix}{name}", key

    def to_dict(self) -> dict:
        return self.model_dump()

    def to_flat_dict(self) -> dict:
        """``to_dict`` with each nested model's keys in its place, as the config block holds them."""
        flat = {}
        for name, value in self.to_dict().items():
            nested = getattr(self, name)
            flat.update(nested.to_flat_dict() if self.nested(name) and nested is not None else {name: value})
        return flat

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    def replace(self, **changes):
        """A copy with ``changes``, validated like the original."""
        return type(self).model_validate({**self.model_dump(), **changes})

    @classmethod
    def describe(cls) -> str:
        """Help text: each key with the config key that sets it, that key's default and its
        description, all from the schema (a field that no config key sets: its own description)."""
        lines = []
        for name, key in cls.config_keys():
            where = [f"config {key}"] if key else []
            with contextlib.suppress(KeyError):
                where += [f"default {json.dumps(documented_default(key))}"] if key else []
            own = cls.model_fields[name].description if name in cls.model_fields else None  # no config key of its own
            text = (schema_node(key) if key else {}).get("description", "").strip() or own or ""
            lines.append(f"  {name}" + (f" ({', '.join(where)})" if where else "") + (f": {text}" if text else ""))
        return f"JSON object ({cls.__name__}) with keys:\n" + "\n".join(lines)

    @classmethod
    def _problems(cls, err: ValidationError, source: str, by_config_key: bool = False) -> str:
        """pydantic's errors as one line: the unknown and missing keys, then each value of the wrong type."""
        errors = err.errors()
        if errors[0]["type"] == "json_invalid":
            return f"{source}: not valid JSON ({errors[0]['ctx']['error']})"
        if errors[0]["type"] == "model_type" and not errors[0]["loc"]:
            return f"{source}: expected a JSON object of {cls.__name__} ({', '.join(cls.keys())})"
        unknown = sorted(cls._located(e["loc"])[0] for e in errors if e["type"] == "extra_forbidden")
        missing = [cls._located(e["loc"])[0] for e in errors if e["type"] == "missing"]  # in field order
        keys = [f"{what} key(s) {names}" for what, names in (("unknown", unknown), ("missing", missing)) if names]
        wrong: dict[str, tuple[list[str], Any]] = {}  # where -> (what was expected, the value)
        for e in errors:
            if e["type"] not in ("extra_forbidden", "missing"):
                where, config_key = cls._located(e["loc"])
                if by_config_key and config_key:
                    where = f"{where} (config {config_key})"
                wrong.setdefault(where, ([], e["input"]))[0].append(EXPECTED.get(e["type"], e["msg"].lower()))
        expected = lambda what: "a number" if sorted(what) == ["float", "int"] else " or ".join(what)  # noqa: E731
        problems = ([f"{cls.__name__} " + "; ".join(keys)] if keys else []) + [
            f"{where}: expected {expected(what)}, got {value!r}" for where, (what, value) in wrong.items()
        ]
        return f"{source}: " + "; ".join(problems)

    @classmethod
    def _located(cls, loc: tuple) -> tuple[str, str | None]:
        """An error's place (``optimizer.learning_rate``, ``epoch_fractions[1]``) and the config
        key of its field. ``loc`` holds the keys down through nested models, list positions,
        and after a plain field the member tags of a union (int | float), which are skipped."""
        where, model, config_key = "", cls, None
        for part in loc:
            if isinstance(part, int):
                where += f"[{part}]"
            elif model is not None:
                where += f"{'.' if where else ''}{part}"
                known = part in model.model_fields
                config_key = model.config_key(part, config_key) if known else None
                model = model.nested(part) if known else None
        return where, config_key


# the data shipped in the project's resources/, read where data.glue_dir or data.squad_dir is null
SHIPPED_DATA = {"glue_dir": "glue", "squad_dir": "squad2"}
PROJECT_RESOURCES = Path(__file__).resolve().parents[2] / "resources"


class DownloadSettings(StageSettings):
    source: str = setting("data.source")
    # null (the shipped data) stays null in the job's settings: where the project lies is no setting,
    # so a moved checkout, or a run's own working directory (snakemake --directory), reruns nothing
    glue_dir: str | None = setting("data.glue_dir")
    squad_dir: str | None = setting("data.squad_dir")
    hub_repo: str | None = setting("data.hub_repo")
    seed: int = setting("data.seed")
    selection_fraction: Number = setting("data.selection_fraction")
    train_size: int | None = setting("tasks.<task>.train_size")
    selection_size: int | None = setting("tasks.<task>.selection_size")
    eval_size: int | None = setting("tasks.<task>.eval_size")
    article_split: dict | None = setting("tasks.<task>.article_split")

    def folder(self, key: str) -> Path:
        """``data.glue_dir`` or ``data.squad_dir`` (``key``), the project's shipped data where it is null."""
        given = getattr(self, key)
        return Path(given) if given is not None else PROJECT_RESOURCES / SHIPPED_DATA[key]


class TokenizeSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    max_length: int = setting("tasks.<task>.max_length")
    doc_stride: int | None = setting("tasks.<task>.doc_stride")  # span tasks only


class FinetuneCompute(StageSettings):
    """Where fine-tuning runs, and in which precision."""

    device: str = setting("finetune.device")
    precision: str = setting("finetune.precision")


class ExtractCompute(StageSettings):
    """Where extraction runs, in which precision and on which runtime."""

    device: str = setting("extract.device")
    precision: str = setting("extract.precision")
    backend: str = setting("extract.backend")


class OptimizerSettings(StageSettings):
    """AdamW, its linear warmup-decay schedule and its batch: the keys of the config block that the
    field holding it names (``finetune.settings``, ``baseline.settings``) that training reads."""

    learning_rate: Number
    batch_size: int
    warmup_ratio: Number
    weight_decay: Number
    max_grad_norm: Number


class ScoredOptimizerSettings(OptimizerSettings):
    """``OptimizerSettings`` and the batch the trained model is scored with, for the stages that
    score what they train (full fine-tuning, its curve, LoRA and BitFit). Fine-tuning to a
    checkpoint scores nothing (rule score_bert does), so a new scoring batch leaves it as it ran."""

    eval_batch_size: int


class BertScoringSettings(StageSettings):
    """The batch BERT's head is run with where no extraction kept its outputs (streamed states)."""

    eval_batch_size: int = setting("finetune.settings.eval_batch_size")


class FinetuneSettings(StageSettings):
    """What a checkpoint's weights follow from. The other checkpoints are not in it: adding a later
    one leaves the jobs of the earlier ones as they ran. At checkpoint 0, which trains nothing,
    ``optimizer`` and ``schedule_epochs`` are None: a change to them leaves it as it ran."""

    backbone: str = setting("backbones.<model>.pretrained")
    optimizer: OptimizerSettings | None = setting("finetune.settings")
    schedule_epochs: Number | None = setting("finetune.settings.schedule_epochs")  # null: the largest epoch fraction


class BaselineSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epochs: int = setting("baseline.epochs")
    optimizer: ScoredOptimizerSettings = setting("baseline.settings")


class EmbeddingPeer(StageSettings):
    """The backbone's sentence embedding and a linear model (``registry/peers``)."""

    method: Literal["embedding"]
    regularization: Numbers = setting("peers.embedding.regularization")
    batch_size: int = setting("peers.embedding.batch_size")
    max_length: int = setting("tasks.<task>.max_length")
    backend: str = setting("extract.backend")  # what encodes the texts, as for the heads' states


class CosinePeer(StageSettings):
    """The cosine of two texts' sentence embeddings, no training."""

    method: Literal["cosine"]
    batch_size: int = setting("peers.embedding.batch_size")
    max_length: int = setting("tasks.<task>.max_length")
    backend: str = setting("extract.backend")


class LoraPeer(StageSettings):
    method: Literal["lora"]
    rank: int = setting("peers.lora.rank")
    alpha: Number = setting("peers.lora.alpha")
    dropout: Number = setting("peers.lora.dropout")
    target_modules: Names = setting("peers.lora.target_modules")
    learning_rates: Numbers = setting("peers.lora.learning_rates")
    epochs: int = setting("peers.lora.epochs")


class BitfitPeer(StageSettings):
    method: Literal["bitfit"]
    learning_rates: Numbers = setting("peers.bitfit.learning_rates")
    epochs: int = setting("peers.bitfit.epochs")


class SetfitPeer(StageSettings):
    method: Literal["setfit"]
    learning_rates: Numbers = setting("peers.setfit.learning_rates")
    pairs_per_example: int = setting("peers.setfit.pairs_per_example")
    max_pair_steps: int = setting("peers.setfit.max_pair_steps")
    batch_size: int = setting("peers.setfit.batch_size")
    max_length: int = setting("tasks.<task>.max_length")


PeerMethodSettings = Annotated[
    EmbeddingPeer | CosinePeer | LoraPeer | BitfitPeer | SetfitPeer,
    Field(discriminator="method", json_schema_extra={"config": "peers"}),
]


class PeerSettings(StageSettings):
    """One peer method's run (config ``peers``): its own block, and for the peers that train the
    encoder with BERT's head (LoRA, BitFit) full fine-tuning's optimizer settings, whose learning
    rate the method's own grid replaces."""

    backbone: str = setting("backbones.<model>.pretrained")
    optimizer: ScoredOptimizerSettings | None = setting("baseline.settings")
    method: PeerMethodSettings


class CurveSettings(StageSettings):
    """BERT's own fine-tuning curve (``experiments.bert_curve``): full fine-tuning's training,
    scored at every point."""

    backbone: str = setting("backbones.<model>.pretrained")
    points: Numbers = setting("experiments.bert_curve.points")
    optimizer: ScoredOptimizerSettings = setting("baseline.settings")


class MixtureSettings(StageSettings):
    """Fine-tuning one encoder on several tasks at once (a shared encoder of ``shared.mixtures``)."""

    backbone: str = setting("backbones.<model>.pretrained")
    tasks: Names = setting("shared.mixtures.<name>.tasks")
    epochs: float = setting("shared.mixtures.<name>.epochs")
    optimizer: OptimizerSettings = setting("finetune.settings")


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


class HeadSettings(StageSettings):
    """One head as a job trains it: its architecture (``heads.models.<name>`` less ``training``)
    and its final training settings (heads.training, then ``tasks.<task>.head_training``, then
    the head's own ``training``), merged once by ``WorkflowSettings.head_settings``."""

    spec: dict = setting("heads.models.<name>")
    training: HeadTrainingSettings = setting("heads.training")

    @staticmethod
    def memory_mb(heads) -> Number:
        """The ``in_memory_max_mb`` of a job that trains ``heads`` together: the smallest any of them allows."""
        return min(head.training.in_memory_max_mb for head in heads)


class HeadRuntimeSettings(StageSettings):
    """Where heads train and how their feature shards are checked."""

    device: str = setting("heads.device")
    verify: str = setting("heads.verify")


class HeadRaceSettings(StageSettings):
    """How a head-training job chooses among its heads (``training.racing``): what its runs
    follow from, so that a setting of the checkpoint race alone reruns no head job."""

    protocol: str = setting("heads.race.protocol")
    rungs: Annotated[tuple[int, ...], Field(strict=False)] = setting("heads.race.rungs")
    keep: Number = setting("heads.race.keep")

    @property
    def racing(self) -> bool:
        return self.protocol == "racing"


class RaceSettings(HeadRaceSettings):
    """``HeadRaceSettings`` and how the race between checkpoints decides (``stages.race``)."""

    min_gain: Number = setting("heads.race.min_gain")
    checkpoint_rule: str = setting("heads.race.checkpoint_rule")


class SearchSettings(StageSettings):
    trials: int = setting("search.trials")
    workers: int = setting("search.workers")
    seed: int = setting("search.seed")
    startup_trials: int = setting("search.startup_trials")
    pruner: dict = setting("search.pruner")
    space: dict = setting("search.space")
    head_seed: int = Field(description="The first of heads.seeds: every trial trains with it.")
