"""A stage's typed settings as a pydantic model (``StageSettings``): read strictly from a
command's JSON or a validated config block, every key present, no unknown key, no bool for a
number, no string for an int; each field naming the config key it comes from (``setting``), its
help that key's default and description from the schema; errors one line naming the flag or the
config key. The models themselves are ``config.settings``'."""

from __future__ import annotations

import contextlib
import functools
import json
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from bertvision.config.schema import documented_default, schema_node
from bertvision.errors import ConfigError, SettingsError


def _whole_as_int(value: int | float) -> int | float:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# A JSON number: an int or a float, never a bool; a whole one is an int (1.0 is 1), so that how a
# config spells a value (1, 1.0) does not change a job's JSON, which Snakemake reruns it on.
Number = Annotated[int | float, AfterValidator(_whole_as_int)]
# A value of search.space (a bound or a choice): a number as Number, a bool or a head option's word.
SpaceValue = bool | Number | str
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
