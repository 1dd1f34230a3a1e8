"""Configuration: JSON-schema validation with defaults filled from the schema (the one place
defaults live), and the effective per-task settings (global settings overridden per task)."""

from __future__ import annotations

import copy
import functools
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from bertvision.tasks import get_task

SCHEMA_PATH = Path(str(resources.files("bertvision") / "schemas" / "config.schema.yaml"))


def fraction_name(fraction: float) -> str:
    """Canonical text of an epoch fraction in paths: 0, 0.3, 1, 2.5."""
    return f"{float(fraction):g}"


class ConfigError(ValueError):
    pass


# Head types trained on every real token of an example (bertvision.heads: ``token_level``);
# listed here so that reading a config never imports torch.
TOKEN_HEAD_TYPES = frozenset({"token-pool"})


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate in place (filling defaults) and return ``config``. Errors name the key path."""
    schema = load_schema()
    validator = _with_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"  {where}: {err.message}")
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines))
    return config


def load_config(path: Path) -> dict:
    with open(path) as fh:
        config = yaml.safe_load(fh) or {}
    return validate_config(config, source=str(path))


def _schema_default(*keys: str) -> dict:
    node = load_schema()
    for key in keys:
        node = node["properties"][key]
    return copy.deepcopy(node["default"])


@functools.lru_cache(maxsize=None)
def _task_default(key: str):
    return copy.deepcopy(load_schema()["properties"]["tasks"]["additionalProperties"]["properties"][key]["default"])


class Settings:
    """Effective settings of a validated config."""

    def __init__(self, config: dict):
        self.config = config
        self._finetune_defaults = _schema_default("finetune", "settings")
        self._head_defaults = _schema_default("heads", "training")

    # --- names ---------------------------------------------------------------------------
    @property
    def models(self) -> list[str]:
        return list(self.config["backbones"])

    @property
    def tasks(self) -> list[str]:
        return list(self.config["tasks"])

    @property
    def heads(self) -> list[str]:
        return list(self.config["heads"]["models"])

    @property
    def fractions(self) -> list[str]:
        return [fraction_name(f) for f in sorted(self.config["finetune"]["epoch_fractions"])]

    def task_overrides(self, name: str) -> dict:
        return self.config["tasks"].get(name) or {}

    # --- per-stage settings ----------------------------------------------------------------
    def pretrained(self, model: str) -> str:
        return self.config["backbones"][model]["pretrained"]

    def max_length(self, task: str) -> int:
        return int(self.task_overrides(task).get("max_length") or get_task(task).max_length)

    def doc_stride(self, task: str) -> int:
        spec = get_task(task)
        default = spec.span.doc_stride if spec.span else 0
        return int(self.task_overrides(task).get("doc_stride") or default)

    def token_features(self, task: str) -> bool:
        """Whether ``task`` (an example task) stores every real token's states, not only [CLS]."""
        wanted = bool(self.task_overrides(task).get("token_features", _task_default("token_features")))
        if wanted and get_task(task).kind == "span":
            raise ConfigError(f"tasks.{task}.token_features: span tasks always store every token; "
                              "token-level example heads are for classification / regression tasks")
        return wanted

    def feature_level(self, task: str) -> str:
        """What extraction stores per row: 'tokens' (every real token) or 'cls'."""
        return "tokens" if get_task(task).kind == "span" or self.token_features(task) else "cls"

    def task_heads(self, task: str) -> dict[str, dict]:
        """The head architectures trained for ``task``: the task's ``heads`` list, or all (then
        without token-level heads unless the task has ``token_features``)."""
        listed = self.task_overrides(task).get("heads")
        names = listed or self.heads
        unknown = [n for n in names if n not in self.config["heads"]["models"]]
        if unknown:
            raise KeyError(f"tasks.{task}.heads: {unknown} not in heads.models ({self.heads})")
        models = self.config["heads"]["models"]
        token = [n for n in names if models[n]["type"] in TOKEN_HEAD_TYPES]
        if token and not self.token_features(task):
            if listed:
                why = ("span tasks train per-token span heads" if get_task(task).kind == "span"
                       else f"set tasks.{task}.token_features: true to extract them")
                raise ConfigError(f"tasks.{task}.heads: {token} are token-level heads "
                                  f"(type {', '.join(sorted({models[n]['type'] for n in token}))}); they need "
                                  f"every token's features, which {task} does not store ({why})")
            names = [n for n in names if n not in token]
            if not names:
                raise ConfigError(f"tasks.{task}: every head in heads.models is token-level ({token}), but the task "
                                  f"has no token features; set tasks.{task}.token_features: true or list [CLS] heads")
        return {n: dict(models[n]) for n in names}

    def download(self, task: str) -> dict:
        data = self.config["data"]
        over = self.task_overrides(task)
        return {
            "source": data["source"],
            "glue_dir": data["glue_dir"],
            "squad_dir": data["squad_dir"],
            "article_split": over.get("article_split"),
            "hub_repo": data["hub_repo"],
            "seed": data["seed"],
            "selection_fraction": data["selection_fraction"],
            "train_size": over.get("train_size"),
            "selection_size": over.get("selection_size"),
            "eval_size": over.get("eval_size"),
        }

    def finetune(self, task: str) -> dict:
        ft = self.config["finetune"]
        merged = {**self._finetune_defaults, **ft["settings"], **self.task_overrides(task).get("finetune", {})}
        return {**merged, "epoch_fractions": sorted(ft["epoch_fractions"]), "device": ft["device"],
                "precision": ft["precision"]}

    def extract(self) -> dict:
        ex = self.config["extract"]
        return {k: ex[k] for k in ("batch_size", "block_rows", "block_tokens", "device", "precision")}

    def search_heads(self, task: str) -> list[str]:
        names = list(self.task_overrides(task).get("search_heads") or [])
        unknown = [n for n in names if n not in self.task_heads(task)]
        if unknown:
            raise ConfigError(f"tasks.{task}.search_heads: {unknown} are not among the task's heads "
                              f"({list(self.task_heads(task))})")
        return names

    def search(self) -> dict:
        """The search settings; trials train with the first head seed."""
        return {**self.config["search"], "head_seed": int(self.config["heads"]["seeds"][0])}

    def _experiment_tasks(self, name: str) -> list[str]:
        tasks = list(self.config["experiments"][name]["tasks"])
        unknown = [t for t in tasks if t not in self.tasks]
        if unknown:
            raise ConfigError(f"experiments.{name}.tasks: {unknown} are not configured tasks ({self.tasks})")
        return tasks

    def data_fraction_tasks(self) -> list[str]:
        return self._experiment_tasks("data_fraction")

    def transfer_tasks(self) -> list[str]:
        return [t for t in self._experiment_tasks("transfer") if len(self.fractions) > 1]

    def data_fraction_heads(self, task: str) -> dict[str, dict]:
        heads = self.task_heads(task)
        names = self.config["experiments"]["data_fraction"]["heads"] or list(heads)
        unknown = [n for n in names if n not in heads]
        if unknown:
            raise ConfigError(f"experiments.data_fraction.heads: {unknown} are not among {task}'s heads ({list(heads)})")
        return {n: heads[n] for n in names}

    def data_fraction_checkpoints(self) -> list[str]:
        wanted = self.config["experiments"]["data_fraction"]["checkpoints"]
        if wanted is None:
            return self.fractions
        names = [fraction_name(f) for f in sorted(wanted)]
        unknown = [n for n in names if n not in self.fractions]
        if unknown:
            raise ConfigError(f"experiments.data_fraction.checkpoints: {unknown} not in finetune.epoch_fractions")
        return names

    def data_fractions(self) -> list[str]:
        return [f"{f:g}" for f in sorted(self.config["experiments"]["data_fraction"]["fractions"])]

    def head_training(self, task: str) -> dict:
        heads = self.config["heads"]
        merged = {**self._head_defaults, **heads["training"], **self.task_overrides(task).get("head_training", {})}
        return {**merged, "device": heads["device"], "verify": heads["verify"]}

