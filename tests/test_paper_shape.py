"""Paper scale that runs (issue 22): random encoders of a named shape, the paper-shape smoke
config kept in step with the paper config, every job's usage line, and each job's request
against its measured peak."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bertvision.errors import MissingError
from bertvision.models.backbone import check_pretrained, load_pretrained, load_tokenizer, resolve_pretrained
from bertvision.models.random_encoder import NAMED_SHAPES, RandomShape, parse_random
from bertvision.plan.estimates import HEAD_GPU_MINUTES, EncoderShape
from bertvision.reporting.request_usage import planned_jobs, requests_table
from bertvision.runtime.usage import JobUsage, log_usage, read_usage
from tests.conftest import REPO, job_counts, snakemake, snakemake_command, workflow_settings

SMOKE = REPO / "configs" / "paper-shape-smoke.yaml"
PAPER = REPO / "configs" / "paper-bert-large.yaml"


@pytest.fixture
def random_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- random encoders --------------------------------------------------------------------------------
def test_random_shapes_parse_named_and_miniature_references():
    assert parse_random("random:bert-large") == RandomShape(24, 1024, 16, 4096)
    assert parse_random("random:bert-base") == NAMED_SHAPES["bert-base"]
    assert parse_random("random:L-4_H-256_A-4") == RandomShape(4, 256, 4, 1024)
    for bad in ("random:bert-huge", "random:L-4_H-250_A-3", "random:L-0_H-64_A-2"):
        with pytest.raises(MissingError, match=bad.replace("random:", "")):
            parse_random(bad)


def test_a_random_encoder_is_built_once_and_loads_like_a_hub_model(random_cache):
    ref = "random:L-2_H-32_A-2"
    check_pretrained(ref)
    assert not random_cache.exists(), "checking a reference must not build the encoder"
    assert EncoderShape.of("random:bert-large") == EncoderShape(24, 1024, 30522, 16)
    assert not random_cache.exists(), "a job request must not build the encoder"

    path = Path(resolve_pretrained(ref))
    assert path.parent.parent == random_cache and (path / "model.safetensors").exists()
    built = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_pretrained(ref) == str(path)
    assert (path / "model.safetensors").stat().st_mtime_ns == built, "a second use rebuilt the encoder"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "a staging folder was left behind"

    model = load_pretrained("AutoModel", ref)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_attention_heads) == (2, 32, 2)
    assert model.config.intermediate_size == 128
    tokens = load_tokenizer(ref)("Is this the uncased vocabulary?")["input_ids"]
    assert len(tokens) > 3 and tokens[0] == 101  # [CLS] of bert-base-uncased's vocabulary


def test_concurrent_jobs_build_one_random_encoder(random_cache):
    code = "from bertvision.models.backbone import resolve_pretrained; print(resolve_pretrained('random:L-1_H-16_A-1'))"
    env = {**os.environ, "BERTVISION_CACHE": str(random_cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    folder = Path(paths.pop())
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]
    load_pretrained("AutoModel", str(folder))


# --- the smoke config follows the paper config --------------------------------------------------------
def test_the_smoke_config_keeps_the_paper_configs_shapes_settings_and_heads():
    smoke, paper = yaml.safe_load(SMOKE.read_text()), yaml.safe_load(PAPER.read_text())
    assert smoke["backbones"].keys() == paper["backbones"].keys()
    (name,) = paper["backbones"]
    assert EncoderShape.of(smoke["backbones"][name]["pretrained"]) == EncoderShape.of(
        paper["backbones"][name]["pretrained"]
    )
    for head, spec in paper["heads"]["models"].items():
        assert smoke["heads"]["models"][head] == spec, head
    assert {k: paper["heads"]["training"][k] for k in ("learning_rate", "batch_size")} == {
        k: smoke["heads"]["training"][k] for k in ("learning_rate", "batch_size")
    }
    assert smoke["finetune"]["settings"] == paper["finetune"]["settings"]
    assert smoke["finetune"]["precision"] == paper["finetune"]["precision"]
    for task, over in smoke["tasks"].items():
        for key in ("max_length", "doc_stride", "finetune", "search_heads"):
            assert over.get(key) == paper["tasks"][task].get(key), f"tasks.{task}.{key}"
        for head in paper["tasks"][task].get("heads", []):
            assert head in over["heads"], f"tasks.{task}.heads lacks {head}"
    listed = {h for over in smoke["tasks"].values() for h in over.get("heads") or smoke["heads"]["models"]}
    assert set(paper["heads"]["models"]) <= listed, "a paper head type is trained nowhere in the smoke run"
    for section in ("search", "experiments", "shared"):
        assert smoke[section].keys() == paper[section].keys(), section


# --- usage lines and requests ----------------------------------------------------------------------------
def test_every_command_ends_its_log_with_its_usage(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        logged = log_usage(logging.getLogger("bertvision"))
    log = tmp_path / "job.log"
    log.write_text("earlier line\n" + caplog.text)
    read = read_usage(log)  # the line rounds to whole MiB and tenths of a second
    assert read.peak_mib == pytest.approx(logged.peak_mib, abs=1)
    assert read.cpu_seconds == pytest.approx(logged.cpu_seconds, abs=0.1)
    assert read_usage(tmp_path / "missing.log") is None
    # a job forked from the warm pool logs the pool's line first, then its own: the last one counts
    log.write_text(
        "forked from the warm pool: peak memory 900 MiB, cpu 1.0 s\njob usage: peak memory 1200 MiB, cpu 3.5 s\n"
    )
    assert read_usage(log) == JobUsage(1200.0, 3.5)

    settings = workflow_settings().download("rte").replace(train_size=20, eval_size=20).to_json()
    job = ["download", "--task", "rte", "--settings", settings, "--out-dir", str(tmp_path / "raw")]
    proc = subprocess.run([sys.executable, "-m", "bertvision", *job], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "cmd.log").write_text(proc.stderr)
    usage = read_usage(tmp_path / "cmd.log")
    assert usage is not None and usage.peak_mib > 50  # an interpreter with pandas loaded
    # a command a person runs is no job: no usage line
    person = subprocess.run([sys.executable, "-m", "bertvision", "validate-config", str(REPO / "config.yaml")],
                            capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert person.returncode == 0 and "job usage" not in person.stderr, person.stderr


def test_the_usage_line_counts_the_cpu_seconds_in_the_kernel_too():
    """A job's CPU seconds are its user and its system time (reading files, page faults)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    logged = log_usage(logging.getLogger("bertvision"))
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert before.ru_stime > 0  # a process that imported its packages
    assert before.ru_utime + before.ru_stime <= logged.cpu_seconds <= after.ru_utime + after.ru_stime


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_the_dry_run_lists_every_job_with_its_request(tmp_path):
    (tmp_path / "resources").symlink_to(REPO / "resources")
    cmd = snakemake_command(tmp_path, "-n", "--forceall", "--cores", "2")
    # every job the config can run: the grid (the race plans each checkpoint once the one before decided)
    at = cmd.index("--configfile") + 1
    cmd[at : at + 1] = [str(REPO / "config.yaml"), str(REPO / "configs/overlays/grid.yaml")]
    dry = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    jobs = planned_jobs(dry.stdout)
    counts = job_counts(dry.stdout)
    assert len(jobs) == sum(counts.values()) - counts["all"]
    assert {j.rule for j in jobs} == set(counts) - {"all"}
    heads = [j for j in jobs if j.rule == "train_heads"]
    assert heads and all(j.mem_mib and j.runtime_min and j.log.startswith("logs/") for j in heads)
    table = requests_table(jobs, tmp_path)
    assert set(table["verdict"]) == {"not run"}


def test_each_request_is_judged_against_the_peak_and_seconds_its_job_measured(tmp_path):
    """A peak Snakemake never sampled (max_rss "-" or 0, a job that ended first) read as "ok", or
    failed the table; the other verdicts worked by hand (MiB and minutes against a peak and seconds)."""
    from bertvision.reporting.request_usage import PlannedJob

    cases = {  # name -> (seconds, max_rss, request MiB, runtime min, verdict)
        "fits": (120.0, "3000.00", 8000, 30, "ok"),
        "over": (12.0, "1500.00", 1000, 30, "OVER"),
        "slow": (1900.0, "3000.00", 8000, 30, "over runtime"),
        "idle": (12.0, "1000.00", 8000, 30, "wasteful"),
        "unsampled": (12.0, "-", 8000, 30, "peak not measured"),
        "zero": (12.0, "0.00", 8000, 30, "peak not measured"),
    }
    jobs = []
    for name, (seconds, rss, mem, minutes, _) in cases.items():
        (tmp_path / f"{name}.tsv").write_text(f"s\th:m:s\tmax_rss\tmax_vms\n{seconds}\t0:00:00\t{rss}\t-\n")
        jobs.append(PlannedJob("extract", name, None, f"{name}.tsv", mem, minutes))
    jobs.append(PlannedJob("extract", "gone", None, "gone.tsv", 8000, 30))
    table = requests_table(jobs, tmp_path)
    assert dict(zip(table["job"], table["verdict"])) == {
        **{name: case[-1] for name, case in cases.items()},
        "gone": "not run",
    }


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_paper_scale_head_jobs_take_a_gpu_where_a_cpu_would_take_hours(tmp_path):
    """The paper config's dry run: heads on BERT-large's MNLI states (CNN heads included) and
    on SQuAD windows ask for the GPU, and their runtimes are then hours, not months; every head
    job left on a CPU asks for no more than HEAD_GPU_MINUTES. With heads.device cpu, a head job
    given a GPU still trains there, and one given none on the CPU."""
    cmd = snakemake_command(tmp_path, "-n", "-p", "--forceall", "--cores", "2", "--config", "heads={device: cpu}")
    cmd[cmd.index("--configfile") + 1] = str(REPO / "configs" / "paper-bert-large.yaml")
    dry = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert dry.returncode == 0, dry.stderr[-2000:]
    jobs = planned_jobs(dry.stdout)
    head_rules = ("train_heads", "train_heads_subset", "search_worker", "transfer", "head_transfer")
    heads = [j for j in jobs if j.rule in head_rules]
    big = [j for j in heads if "task=mnli" in j.wildcards or "task=squad2," in j.wildcards + ","]
    assert big and all(j.gpus == 1 and j.runtime_min < 24 * 60 for j in big), big[:3]
    on_cpu = [j for j in heads if j.gpus == 0]
    assert on_cpu and all(j.runtime_min <= HEAD_GPU_MINUTES for j in on_cpu), max(j.runtime_min for j in on_cpu)
    device = {
        log: json.loads(runtime)["device"]
        for runtime, log in re.findall(r"^Shell command: .*--runtime '(\{[^']*\})'.* > (\S+) 2>&1$", dry.stdout, re.M)
    }
    assert all(device[j.log] == ("auto" if j.gpus else "cpu") for j in heads), [(j.log, j.gpus) for j in heads[:3]]


@pytest.mark.slow
def test_a_reduced_paper_shape_run_stays_within_every_request(tmp_path, random_cache):
    """The smoke config on a 2-layer random encoder and a handful of rows: every stage of the
    paper config runs, and no job's peak memory goes above what it asked for."""
    config = yaml.safe_load(SMOKE.read_text())
    (name,) = config["backbones"]
    config["backbones"][name]["pretrained"] = "random:L-2_H-64_A-2"
    for name, over in config["tasks"].items():
        # a regression's selection split needs two rows (its Pearson is undefined on one): 20 leave 2
        over.update(train_size=20 if name == "stsb" else 12, selection_size=8, eval_size=8)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "resources").symlink_to(REPO / "resources")
    snakemake(tmp_path, timeout=3000)
    dry = subprocess.run(
        snakemake_command(tmp_path, "-n", "--forceall", "--cores", "2"), capture_output=True, text=True, cwd=tmp_path
    )
    table = requests_table(planned_jobs(dry.stdout), tmp_path)
    assert (table["verdict"] != "not run").all(), table[table["verdict"] == "not run"]
    over = table[table["verdict"] == "OVER"]
    assert over.empty, over.to_string()
    assert (tmp_path / "results" / "tables" / "summary.md").exists()


def test_a_random_encoder_whose_cache_cannot_be_written_is_one_line(tmp_path):
    """A read-only home (a container's) with BERTVISION_CACHE unset: the job that builds the
    encoder says where and what to set, in one line (it was a PermissionError traceback)."""
    (tmp_path / "a-file").write_text("")
    settings = json.dumps({"backbone": "random:L-2_H-64_A-2", "max_length": 16, "doc_stride": None})
    proc = subprocess.run(
        [sys.executable, "-m", "bertvision", "tokenize", "--task", "sst2", "--settings", settings,
         "--raw-dir", str(tmp_path), "--out-dir", str(tmp_path / "tokens")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "BERTVISION_CACHE": str(tmp_path / "a-file" / "cache")},
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"random:L-2_H-64_A-2: a random encoder is built once into {tmp_path / 'a-file' / 'cache'}" in errors[0]
    assert "set BERTVISION_CACHE to a writable folder" in errors[0]
