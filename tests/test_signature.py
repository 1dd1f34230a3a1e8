"""A command made from a stage's signature (``commands.signature``): every annotation the stages
use becomes the flag a rule passes, and the stage gets the value its annotation names."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import pytest

from bertvision.commands.signature import call, parser_of
from bertvision.config.settings import ExtractCompute, ExtractSettings, HeadRuntimeSettings, HeadSettings
from bertvision.errors import SettingsError
from bertvision.features.source import StreamSource
from bertvision.layout import Checkpoint, Run
from bertvision.registry.task_spec import TaskSpec

RUNTIME = {"device": "cpu", "verify": "none"}


def planted_stage(
    task: TaskSpec,
    runtime: HeadRuntimeSettings,
    heads: dict[str, HeadSettings],
    checkpoint: Checkpoint,
    tokens_dirs: dict[str, Path],
    pairs: list[tuple[str, Path]],
    runs: list[Run],
    seeds: list[int],
    attrs: dict,
    precision: Literal["fp32", "bf16"],
    out_dir: Path,
    manifests: list[Path | StreamSource] = (),
    previous: Path | None = None,
    scored_splits: tuple[str, ...] = (),
    train_fraction: float = 1.0,
    last: bool = False,
    encoders: list[dict] = (),
):
    return locals()


def parse(*argv: str) -> dict:
    return call(planted_stage, parser_of("planted", "", planted_stage).parse_args(list(argv)))


HEAD = {"spec": {"type": "lp"}, "training": {"learning_rate": 1e-3, "batch_size": 8, "max_epochs": 2, "patience": 1,
        "weight_decay": 0.0, "warmup_ratio": 0.0, "in_memory_max_mb": 64, "standardize": True}}  # fmt: skip
REQUIRED = [
    "--task", "mrpc", "--runtime", json.dumps(RUNTIME), "--heads", json.dumps({"lp": HEAD}), "--checkpoint", "0.3",
    "--tokens-dirs", "mrpc=tok/mrpc", "sst2=tok/sst2", "--pairs", "mrpc=a", "mrpc=b",
    "--runs", json.dumps([{"model": "m", "task": "mrpc", "ftseed": 1, "checkpoint": "0.3"}]), "--seeds", "1", "2",
    "--attrs", '{"kind": "x"}', "--precision", "bf16", "--out-dir", "out",
]  # fmt: skip


def test_each_annotation_gives_the_stage_the_value_it_names():
    got = parse(*REQUIRED, "--scored-splits", "selection", "dev", "--previous")
    assert got["task"].name == "mrpc"
    assert got["runtime"] == HeadRuntimeSettings(**RUNTIME)
    assert got["heads"]["lp"].training.batch_size == 8
    assert got["checkpoint"] == Checkpoint(0.3)
    assert got["tokens_dirs"] == {"mrpc": Path("tok/mrpc"), "sst2": Path("tok/sst2")}
    assert got["pairs"] == [("mrpc", Path("a")), ("mrpc", Path("b"))]  # a name may repeat
    assert got["runs"] == [Run("m", "mrpc", 1, Checkpoint(0.3))]
    assert got["seeds"] == [1, 2] and got["attrs"] == {"kind": "x"} and got["precision"] == "bf16"
    assert got["out_dir"] == Path("out") and got["scored_splits"] == ["selection", "dev"]
    assert got["previous"] is None  # given empty: a rule's optional input that is not there
    assert got["train_fraction"] == 1.0 and got["last"] is False  # left out: the stage's defaults


def test_a_list_of_feature_sources_takes_manifests_and_stream_sources():
    """transfer's checkpoints: a stored one is its manifest, a streamed one (store: false) its source."""
    settings, compute = (
        ExtractSettings(batch_size=8, block_rows=16, block_tokens=64),
        ExtractCompute(device="cpu", precision="fp32", backend="torch"),
    )
    streamed = StreamSource("models/m/ckpt-0.3", "tokens", settings, compute, {"task": "sst2"})
    got = parse(*REQUIRED, "--manifests", "features/manifest.json", streamed.to_json())["manifests"]
    assert got == [Path("features/manifest.json"), streamed]


def test_a_list_flag_may_be_given_empty_but_must_be_given():
    assert parse(*[a for a in REQUIRED if a not in ("1", "2")])["seeds"] == []
    without = REQUIRED[: REQUIRED.index("--seeds")] + REQUIRED[REQUIRED.index("--attrs") :]
    with pytest.raises(SystemExit):
        parse(*without)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--task", "mnli2", "--task: unknown task 'mnli2'"),
        ("--runtime", '{"device": "cpu"}', "--runtime: HeadRuntimeSettings missing key(s) ['verify']"),
        ("--heads", "[1]", "--heads: expected a JSON object of name -> HeadSettings"),
        ("--checkpoint", "half", "--checkpoint: expected an epoch fraction, got 'half'"),
        ("--attrs", "{x", "--attrs: not valid JSON"),
        # JSON of another shape than the parameter's, or records that are not its records: tracebacks
        ("--attrs", "[1]", "--attrs: expected a JSON object, got '[1]'"),
        ("--runs", '{"model": "m"}', "--runs: expected a JSON list"),
        ("--runs", '[{"model": "m"}]', "--runs: not a list of Run records (missing key 'task')"),
        ("--runs", '[{"model": "m", "task": "mrpc", "ftseed": 1, "checkpoint": "half"}]', "--runs: not a list of Run"),
    ],
)
def test_a_bad_value_is_one_error_naming_its_flag(flag, value, message):
    argv = list(REQUIRED)
    argv[argv.index(flag) + 1] = value
    with pytest.raises(SettingsError) as err:
        parse(*argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_list_of_objects_refuses_other_items_by_its_flag():
    assert parse(*REQUIRED, "--encoders", '[{"name": "a"}]')["encoders"] == [{"name": "a"}]
    with pytest.raises(SettingsError, match="--encoders: expected each item a JSON object"):
        parse(*REQUIRED, "--encoders", "[1]")


def test_a_bad_name_path_pair_names_its_flag():
    for bad in ("no-equals-sign", "mrpc=", "=tok/mrpc"):  # a name and a path each: "mrpc=" read as "."
        argv = list(REQUIRED)
        argv[argv.index("--tokens-dirs") + 1] = bad
        with pytest.raises(SettingsError, match=f"--tokens-dirs: expected NAME=PATH, got '{bad}'"):
            parse(*argv)
    argv = list(REQUIRED)
    argv[argv.index("--tokens-dirs") + 1] = "mrpc=runs/lr=0.1/tok"  # a path may hold "=", a name not
    assert parse(*argv)["tokens_dirs"]["mrpc"] == Path("runs/lr=0.1/tok")


def test_literal_choices_and_the_settings_keys_are_in_the_help():
    text = parser_of("planted", "", planted_stage).format_help()
    assert "{fp32,bf16}" in text
    assert "--runtime: JSON object (HeadRuntimeSettings) with keys:" in text and "config heads.verify" in text
    assert "(default 1.0)" in text  # train_fraction's default, the stage's


def test_every_flag_of_every_command_says_what_it_takes():
    """Each command's flags come from its stage's parameters; each parameter name has its help text."""
    from bertvision.commands.main import command_parser
    from bertvision.commands.stages import COMMANDS

    def says_more_than_its_default(text: str | None) -> bool:
        return bool(re.sub(r"\(default[^)]*\)s?\)", "", text or "").strip())

    silent = [
        (name, action.option_strings[0])
        for name in COMMANDS
        for action in command_parser(name)._actions
        if action.option_strings and action.dest != "help" and not says_more_than_its_default(action.help)
    ]
    assert not silent, silent
    # and each help text is some command's parameter's (HELP holds no text for a parameter gone)
    from bertvision.commands.signature import HELP

    dests = {action.dest for name in COMMANDS for action in command_parser(name)._actions}
    assert set(HELP) - dests == set()


def test_a_bare_list_argument_takes_at_least_one_value():
    """``bertvision serve`` with no bundle is a usage error naming what it wants, not a bundle looked for in ``.``."""
    from bertvision.commands.main import command_parser

    with pytest.raises(SystemExit):
        command_parser("serve").parse_args([])
    assert command_parser("serve").parse_args(["a", "b"]).bundles == [Path("a"), Path("b")]


def test_a_switch_says_no_default_and_a_valued_flag_shows_its_own():
    """A bool parameter is a switch, off unless given: its help shows no default (always False)."""
    parser = parser_of("planted", "", planted_stage)
    helps = {action.dest: action.help for action in parser._actions}
    assert "(default" not in helps["last"] and helps["train_fraction"].endswith("(default %(default)s)")
    assert parse(*REQUIRED, "--last")["last"] is True
