"""Configuration: the schema fills defaults, rejects bad values with the key path, and every
shipped config validates."""

import copy
from pathlib import Path

import pytest
import yaml

from bertvision.config import ConfigError, Settings, load_config, validate_config
from tests.conftest import REPO

SHIPPED = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    config = load_config(path)
    assert config["tasks"]


def minimal():
    return {"backbones": {"m": {"pretrained": "bert-base-uncased"}}, "tasks": {"mrpc": None}}


def test_defaults_are_filled_from_the_schema():
    config = validate_config(minimal())
    assert config["finetune"]["epoch_fractions"] == [0, 0.3, 1.0]
    assert config["heads"]["seeds"] == [1, 2, 3]
    assert config["data"]["selection_fraction"] == 0.1
    assert set(config["heads"]["models"]) >= {"lp", "ap", "adapter64"}


def test_task_overrides_merge_over_global_settings():
    config = minimal()
    config["finetune"] = {"settings": {"learning_rate": 3e-5}}
    config["tasks"]["mrpc"] = {"finetune": {"batch_size": 16}, "max_length": 100}
    settings = Settings(validate_config(config))
    ft = settings.finetune("mrpc")
    assert ft["learning_rate"] == 3e-5 and ft["batch_size"] == 16 and ft["warmup_ratio"] == 0.1
    assert settings.max_length("mrpc") == 100
    assert settings.fractions == ["0", "0.3", "1"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["tasks"].update({"squadx": None}), r"tasks: 'squadx' is not one of"),
        (lambda c: c.update({"finetune": {"epoch_fractions": [-1]}}), r"finetune.epoch_fractions.0: -1 is less than"),
        (lambda c: c.update({"heads": {"models": {"x": {"type": "cnn"}}}}), r"heads.models.x.type: 'cnn' is not one of"),
        (lambda c: c.update({"data": {"selection_fraction": 1.5}}), r"data.selection_fraction: 1.5 is greater"),
        (lambda c: c.update({"extract": {"shards": 0}}), r"extract.shards: 0 is less than the minimum of 1"),
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
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid configuration\n  \(top level\): 'backbones' is a required"):
        load_config(bad)


def test_validation_does_not_share_default_objects():
    a, b = validate_config(minimal()), validate_config(minimal())
    a["heads"]["models"]["lp"]["dropout"] = 0.5
    assert "dropout" not in b["heads"]["models"]["lp"]
