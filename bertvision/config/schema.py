"""The config schema: loaded from ``schema.yaml`` with its ``x-registry`` nodes filled in from the
registries, validated with JSON Schema, and the source of every default (validation fills them
in place) and of the help text of every setting."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import math
import re
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from bertvision.errors import ConfigError
from bertvision.registry.heads import HEAD_TYPES, PAIR_OPTION, READS_OPTION, head_options, searchable_parameters
from bertvision.runtime.precision import BACKENDS, PRECISIONS

SCHEMA_FILE = Path(str(resources.files("bertvision.config") / "schema.yaml"))


def _head_spec_schema(node: dict) -> dict:
    """One head of heads.models: a registered type and only that type's options, each with its
    registered type, range and default."""
    per_type = [
        {
            "if": {"required": ["type"], "properties": {"type": {"const": name}}},
            "then": {
                "additionalProperties": False,
                "properties": {
                    "type": {},
                    **{k: o.json_schema() for k, o in head_options(head_type).items()},
                    "training": {
                        "$ref": "#/$defs/head_training",
                        "description": "This head's own training settings, over heads.training and the task's.",
                    },
                },
            },
        }
        for name, head_type in HEAD_TYPES.items()
    ]
    return {
        "description": node.get("description", ""),
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {
                "enum": list(HEAD_TYPES),
                "description": "; ".join(f"{n}: {t.help}" for n, t in HEAD_TYPES.items()),
            },
            # the per-example heads' input options, documented once (each type's own block allows them)
            **{k: _without_default(o.json_schema()) for k, o in (("reads", READS_OPTION), ("pair", PAIR_OPTION))},
        },
        "allOf": per_type,
    }


def _without_default(schema: dict) -> dict:
    """A property documented where it would otherwise fill in its default for every head type."""
    return {k: v for k, v in schema.items() if k != "default"}


REGISTRY_NODES = {
    # a registered task's name, or one a declared task can take (config/declared_tasks.py)
    "tasks": lambda node: {"pattern": "^[a-z0-9][a-z0-9-]*$"},
    "head-spec": _head_spec_schema,
    "searchable": lambda node: {"enum": sorted(searchable_parameters())},
    "precisions": lambda node: {**{k: v for k, v in node.items() if k != "x-registry"}, "enum": list(PRECISIONS)},
    "backends": lambda node: {**{k: v for k, v in node.items() if k != "x-registry"}, "enum": list(BACKENDS)},
}


def _fill_registries(node):
    if isinstance(node, dict):
        if "x-registry" in node:
            return REGISTRY_NODES[node["x-registry"]](node)
        return {k: _fill_registries(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill_registries(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return _fill_registries(yaml.safe_load(SCHEMA_FILE.read_text()))


def load_schema() -> dict:
    """The full schema (a copy: callers may change it)."""
    return copy.deepcopy(_schema())


def _with_defaults(validator_class):
    """The validator, extended to fill each absent key with its default and to read a scalar written as
    text as the number, bool or null its key's schema asks for (``_scalar``)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
                elif isinstance(sub.get("default"), dict) and isinstance(instance[name], dict) and _fixed_keys(sub):
                    # a block of settings written in part (finetune.settings: {batch_size: 16}): the rest its default's
                    instance[name] = {**copy.deepcopy(sub["default"]), **instance[name]}
                elif isinstance(instance.get(name), (str, list, float)):  # read before the key's own checks run
                    instance[name] = _scalars(instance[name], resolve(sub, _schema()))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _fixed_keys(node: dict) -> bool:
    """``node`` is an object of named settings (not of a user's names: heads.models)."""
    return resolve(node, _schema()).get("additionalProperties") is False


def _scalars(value, node: dict):
    """``_scalar`` of a text or whole float value, or of each such item of a list whose items ``node`` types."""
    if not isinstance(value, list):
        return _scalar(value, node)
    items = resolve(node["items"], _schema()) if isinstance(node.get("items"), dict) else {}
    return [_scalar(x, items) if isinstance(x, (str, float)) else x for x in value]


NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _scalar(text: str | float, node: dict):
    """``text`` as the number, bool or null that ``node`` (a key's schema) asks for, when it asks for
    no string: PyYAML reads ``5e-5`` (no dot) as a string, and Snakemake's ``--config`` reads every
    value inside a list or mapping as one (``finetune={settings: {learning_rate: 5e-5}}``). A whole
    float where an integer belongs (16.0, which JSON Schema counts an integer) is that int."""
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if isinstance(text, float):
        return int(text) if "integer" in kinds and "number" not in kinds and text.is_integer() else text
    if not kinds or "string" in kinds:
        return text
    word = text.strip()
    if {"integer", "number"} & set(kinds) and re.fullmatch(r"[+-]?\d+", word):
        return int(word)  # a number keeps an int as given, as YAML would
    if "number" in kinds and NUMBER.fullmatch(word):
        return float(word)
    if "integer" in kinds and NUMBER.fullmatch(word) and float(word).is_integer():
        return int(float(word))  # 50.0 or 5e1, written where a whole number belongs
    if "boolean" in kinds and word.lower() in ("true", "false"):
        return word.lower() == "true"
    if "null" in kinds and word in ("null", "~", ""):
        return None
    return text


def validate_config(config: dict, source: str = "config") -> dict:
    """Validate in place (filling defaults) and return ``config``; a ConfigError has one line
    per problem, naming the source and the key path."""
    validator = _with_defaults(jsonschema.Draft202012Validator)(_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    mistyped = {tuple(err.absolute_path) for err in errors if err.validator == "type"}
    errors = [err for err in errors if err.validator != "enum" or tuple(err.absolute_path) not in mistyped]
    if errors:
        where = lambda err: ".".join(str(p) for p in err.absolute_path) or "(top level)"  # noqa: E731
        lines = dict.fromkeys(f"{source}: {where(err)}: {_message(err)}" for err in errors)  # a head's option: twice
        raise ConfigError("\n".join(lines))
    outsized = [f"{source}: {'.'.join(map(str, key))}: {problem}" for key, problem in _outsized_numbers(config)]
    if outsized:
        raise ConfigError("\n".join(outsized))
    return config


LARGEST = 1e12  # beyond what any setting takes (rows, seeds below 2**32, epochs, megabytes)


def _outsized_numbers(value, key: tuple = ()):
    """(key, problem) for each number the schema's bounds let through that no setting takes: NaN
    (every comparison with it is false) or infinite, or larger than ``LARGEST``."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _outsized_numbers(item, (*key, name))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _outsized_numbers(item, (*key, i))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isnan(value) or math.isinf(value):
            written = ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
            yield key, f"{written} is not a number any setting takes: give a finite one"
        elif abs(value) > LARGEST:
            yield key, f"{float(value):g} is larger than any setting takes (at most {LARGEST:g})"


# Keys a config may still carry from an earlier release, (its section, key) -> where the setting went.
MOVED_KEYS = {
    ("tasks", "pair"): (
        "a pair form is a head's now (heads.models.<head>.pair: apart); selection chooses among the heads"
    ),
}


def _message(err: jsonschema.ValidationError) -> str:
    """jsonschema's message, but for keys that exclude each other (``dependentSchemas: {a: {not:
    {required: [b]}}}``) one naming the keys, not the whole block, and for a key that moved
    (``MOVED_KEYS``) where it went, for a list where a mapping of names belongs how to write it, and
    for a value that fits none of a key's forms the key's description."""
    path = list(err.schema_path)
    section = str(err.absolute_path[0]) if err.absolute_path else None
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        moved = [k for k in err.instance if (section, k) in MOVED_KEYS and k not in err.schema.get("properties", {})]
        if moved:
            return "; ".join(f"{k!r} is no longer a key here: {MOVED_KEYS[section, k]}" for k in moved)
        known = list(err.schema.get("properties", {}))
        near = {k: difflib.get_close_matches(str(k), known, n=1) for k in err.instance if k not in known}
        if near and all(near.values()):
            return "; ".join(f"{k!r} is not a key here: did you mean {match[0]!r}?" for k, match in near.items())
    if err.validator == "not" and set(err.validator_value) == {"required"} and path[-3:-2] == ["dependentSchemas"]:
        keys = [path[-2], *err.validator_value["required"]]
        return f"{' and '.join(map(repr, keys))} exclude each other: give one of them"
    if err.validator == "type" and err.validator_value == "object" and isinstance(err.instance, list):
        if not isinstance(err.schema.get("additionalProperties"), dict):  # an object of its own keys
            keys = ", ".join(f"{k}: ..." for k in err.schema.get("required") or err.schema.get("properties", {}))
            return f"a mapping {{{keys}}}, not a list"
        first = err.instance[0] if err.instance and isinstance(err.instance[0], str) else "NAME"
        required = err.schema["additionalProperties"].get("required") or []
        example = "{" + ", ".join(f"{k}: ..." for k in required) + "}"
        return f"a mapping of names to their settings, not a list (write `{first}: {example}`" + (
            ")" if required else " for a name's defaults)"
        )
    expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
    if err.validator == "type" and isinstance(err.instance, bool) and "string" in expected:
        return (
            f"{err.instance!r} is not a string: YAML reads a bare yes, no, on, off, true or false as a boolean; "
            f"quote it as written ({BOOLEAN_WORDS[err.instance]})"
        )
    if err.validator in ("oneOf", "anyOf") and err.schema.get("description"):  # "not valid under any of ..."
        return f"{err.instance!r} is not one of the forms this key takes: {err.schema['description'].strip()}"
    if err.validator == "type" and err.instance is None:  # YAML's word for it, not Python's
        return f"null is not of type {', '.join(map(repr, expected))}"
    if err.validator == "enum" and err.instance is None:
        return f"null is not one of {err.validator_value!r}"
    return err.message


# the words YAML reads as each boolean: which one a config wrote is lost with the parse
BOOLEAN_WORDS = {True: "'yes', 'on' or 'true'", False: "'no', 'off' or 'false'"}


YAML_TYPES = {bool: "boolean", int: "number", float: "number"}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error, not the last one
    silently, and a key is a name: every key of the config is one (a head, a task, a setting)."""


def _mapping_once(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    lines: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys give way to the mapping's own
            continue
        key = loader.construct_object(key_node)
        problem = None
        if not isinstance(key, str):
            written = key_node.value if isinstance(key_node.value, str) else key
            read_as = "null" if key is None else f"a {YAML_TYPES.get(type(key), type(key).__name__)}"
            problem = f"key {written} is read as {read_as}, not a name: quote it ('{written}') if it is one"
        if key in lines:
            problem = f"key {key!r} given twice in one mapping (first on line {lines[key]})"
        if problem:
            raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        lines[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)


def read_config(path: Path) -> dict:
    """A config file's contents (not yet validated); a YAML error, or a key given twice, names the
    file and line."""
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.load(fh, Loader=_UniqueKeyLoader) or {}  # noqa: S506 (a safe loader)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {err.start}: {err.object[err.start : err.start + 1]!r})"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path}: a config is a mapping of keys (backbones:, tasks:, ...), not a {type(config).__name__}"
        )
    return config


def schema_node(key: str) -> dict:
    """The schema of a dotted config key (``finetune.settings.learning_rate``), following
    ``$ref``/``allOf``; ``<task>`` and ``<head>`` stand for any name."""
    root = _schema()
    node = root
    for part in key.split("."):
        node = resolve(node, root)
        if part.startswith("<"):
            node = node["additionalProperties"]
        else:
            node = node["properties"][part]
    return node


def resolve(node: dict, root: dict) -> dict:
    """``node`` with its ``$ref`` (or ``allOf``'s first ``$ref``) followed within ``root``."""
    while "properties" not in node and ("$ref" in node or "allOf" in node):
        ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
        node = root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    return node


def schema_default(key: str):
    """The default the schema gives a config key (a copy)."""
    return copy.deepcopy(schema_node(key)["default"])


def documented_default(key: str):
    """The default a config key takes when left out: its own schema default, or its entry in its
    parent's (``finetune.settings`` holds those of its keys). KeyError when it has none (a
    per-task key, say: the task registry's value applies)."""
    with contextlib.suppress(KeyError):
        return schema_default(key)
    parent, _, name = key.rpartition(".")
    default = schema_node(parent).get("default") if parent else None
    if isinstance(default, dict) and name in default:
        return copy.deepcopy(default[name])
    raise KeyError(key)
