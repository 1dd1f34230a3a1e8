"""The tiny workflow through a real SLURM with the project's profile (profiles/slurm): every
heavy rule is its own SLURM job, the GPU rules of this config (finetune, baseline, extract; the
config has no shared encoder and no streamed task, whose rules ask for GPUs too) request
gres/gpu and no other job does, and the tables equal those of a local run of the same config.

Needs a running cluster whose node has a GPU GRES, e.g. the fake one from
`scripts/slurm/start-local-cluster.sh` (run as root; `.ci/run` does it). Skipped when `sinfo` is
missing or the cluster does not answer."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bertvision.runtime.device import SIMULATE_OOM_ENV
from tests.conftest import REPO, snakemake, snakemake_command, tiny_config

pytestmark = pytest.mark.slurm
SLURM_PROFILE = REPO / "profiles" / "slurm"
GPU_RULES = {"finetune", "baseline", "extract", "peer", "embed"}
LOCAL_RULES = {"all", "download", "tables", "plots"}


def slurm_cmd(*args: str, timeout: int = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["timeout", "-s", "KILL", str(timeout), *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def cluster() -> dict:
    """The default partition, the GPU type of its node's GRES (None if untyped) and the user's
    default account (None without accounting)."""
    if shutil.which("sinfo") is None:
        pytest.skip("no SLURM here (sinfo not found); scripts/slurm/start-local-cluster.sh sets one up")
    info = slurm_cmd("sinfo", "-h", "-o", "%P|%a|%T|%G")
    if info.returncode != 0 or not info.stdout.strip():
        pytest.skip(f"the SLURM cluster does not answer: {info.stderr.strip() or info.stdout.strip()}")
    rows = [line.split("|") for line in info.stdout.split()]
    default = next((r for r in rows if r[0].endswith("*")), rows[0])
    partition, gres = default[0].rstrip("*"), default[3]
    assert default[1] == "up" and default[2] in {"idle", "mixed", "allocated"}, f"partition not usable: {rows}"
    gpu = re.search(r"gpu(?::([A-Za-z0-9_.]+))?:(\d+)", gres)
    assert gpu, f"the nodes of partition {partition} have no GPU GRES ({gres!r})"
    model = gpu.group(1)
    sacct = slurm_cmd("sacct", "-n", "-X", "-S", "now-1minutes")
    assert sacct.returncode == 0, f"sacct does not work (needs slurmdbd): {sacct.stderr}"
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    account = slurm_cmd("sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount").stdout.strip()
    return {"partition": partition, "gpu_model": model, "gpus": int(gpu.group(2)), "account": account or None}


def slurm_config(tiny_bert: Path) -> dict:
    """The tiny test config cut to MRPC and one checkpoint (every SLURM job costs ~10 s of
    Snakemake start-up, and the plugin polls at growing intervals), with its 2 extraction
    shards as 2 GPU jobs; one GPU per GPU rule and one thread per job, so that two jobs share
    the 2-CPU test node (the local run uses the same threads)."""
    config = tiny_config(tiny_bert)
    config["tasks"] = {"mrpc": config["tasks"]["mrpc"]}
    config["finetune"]["epoch_fractions"] = [1.0]
    config.pop("experiments", None)
    config.pop("shared", None)
    config["resources"] = {**config.get("resources", {}), "gpu_rules": 1, "threads": 1}
    config["baseline"] = {"epochs": 2, "seeds": [1]}
    return config


def sacct_jobs(run_id: str) -> pd.DataFrame:
    """One row per SLURM job (allocation) of a Snakemake run, found by its job name (the run ID)."""
    fields = ["JobID", "JobName", "Comment", "State", "ReqTRES", "AllocTRES", "Elapsed"]
    for _ in range(60):  # slurmdbd records the end of a job shortly after slurmctld
        out = slurm_cmd("sacct", "-n", "-X", "-P", "-S", "now-2hours", "--name", run_id, "-o", ",".join(fields))
        assert out.returncode == 0, out.stderr
        rows = [line.split("|") for line in out.stdout.splitlines() if line]
        if rows and all(r[3] not in {"PENDING", "RUNNING", "COMPLETING"} for r in rows):
            break
        time.sleep(1)
    assert rows, f"sacct knows no job named {run_id}"
    jobs = pd.DataFrame(rows, columns=fields)
    jobs["rule"] = jobs["Comment"].str.extract(r"^rule_(.+?)(?:_wildcards_.*)?$", expand=False)
    return jobs


def retry_config(tiny_bert: Path) -> dict:
    """MRPC run with batches of 8 (which a simulated memory limit of 4 rows will not fit) and an
    optuna search of lp whose 2 workers are SLURM jobs; no peers (the main run covers their rules),
    since the two runs share the test node's two CPUs and every job waits for one."""
    config = slurm_config(tiny_bert)
    config["finetune"]["settings"]["batch_size"] = 8
    config["extract"] = {"shards": 1, "batch_size": 8}
    config["heads"]["models"] = {"lp": {"type": "lp"}}
    only_lp = {"token_features": False, "search_heads": ["lp"], "heads": ["lp"], "peers": []}
    config["tasks"]["mrpc"] = {**config["tasks"]["mrpc"], **only_lp}
    config["search"] = {"trials": 4, "workers": 2, "space": {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}}}
    return config


@pytest.fixture(scope="module")
def runs(cluster, tiny_bert, tmp_path_factory) -> dict:
    """The local run, the SLURM run of the same config and the retry run (``retry_run``), side
    by side: the SLURM runs spend most of their time waiting on the scheduler's status checks."""
    config, retry = slurm_config(tiny_bert), retry_config(tiny_bert)
    local = tmp_path_factory.mktemp("local")
    (local / "config.yaml").write_text(yaml.safe_dump(config))
    workdirs = {"slurm": tmp_path_factory.mktemp("slurm"), "retry": tmp_path_factory.mktemp("slurm-retry")}
    with ThreadPoolExecutor(3) as pool:
        started = {
            "local": pool.submit(snakemake, local, timeout=600),
            "slurm": pool.submit(run_on_slurm, workdirs["slurm"], config, cluster),
            # the retry run stops at the tables its tests read: its bundle would be one more job
            # on the node's two CPUs, which the three runs share
            "retry": pool.submit(
                run_on_slurm, workdirs["retry"], retry, cluster, {SIMULATE_OOM_ENV: "4"}, ["results/tables/glue.csv"]
            ),
        }
        done = {name: future.result() for name, future in started.items()}
    return {
        "slurm": {"local": local, "slurm": workdirs["slurm"], "config": config, **done["slurm"]},
        "retry": {"slurm": workdirs["retry"], **done["retry"]},
    }


@pytest.fixture(scope="module")
def slurm_run(runs):
    return runs["slurm"]


def run_on_slurm(
    workdir: Path, config: dict, cluster: dict, extra_env: dict | None = None, targets: tuple[str, ...] = ()
) -> dict:
    """``snakemake --profile profiles/slurm`` on ``config`` in ``workdir`` (its ``targets``, else
    the whole workflow); the SLURM run ID and log."""
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "BERTVISION_SLURM_PARTITION": cluster["partition"],
        "BERTVISION_SLURM_ACCOUNT": cluster["account"] or "",
        "BERTVISION_SLURM_GPU_MODEL": cluster["gpu_model"] or "",
        **(extra_env or {}),
    }
    # The profile as a user runs it, plus what a test needs: a hard timeout (snakemake waits
    # forever for jobs whose status it cannot get) and a first status check after 3 s instead of
    # 40 (the plugin then waits 10 s longer after every check that finds nothing finished, and
    # starts over at 3 s when one has; the jobs here take 9-22 s).
    cmd = snakemake_command(
        workdir,
        "--profile",
        str(SLURM_PROFILE),
        "--jobs",
        "4",
        "--slurm-init-seconds-before-status-checks",
        "3",
        "--latency-wait",
        "10",
        *targets,
        timeout=900,
    )
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        logs = [*(workdir / ".snakemake" / "slurm_logs").rglob("*.log"), *(workdir / "logs").rglob("*.log")]
        slurm_logs = "\n".join(
            f"--- {p}\n{p.read_text()[-2000:]}" for p in sorted(logs, key=lambda p: p.stat().st_mtime)[-4:]
        )
        raise AssertionError(
            f"snakemake on SLURM failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-6000:]}\n{slurm_logs}"
        )
    run_id = re.search(r"SLURM run ID: (\S+)", proc.stderr + proc.stdout)
    assert run_id, proc.stderr[-3000:]
    print(f"SLURM run {run_id.group(1)}: {seconds:.0f} s")
    (workdir / "snakemake-slurm.log").write_text(proc.stderr + proc.stdout)
    return {"run_id": run_id.group(1), "log": proc.stderr + proc.stdout}


def test_every_heavy_rule_ran_as_a_slurm_job_and_only_gpu_rules_requested_gpus(slurm_run, cluster):
    jobs = sacct_jobs(slurm_run["run_id"])
    print(jobs.drop(columns=["JobName"]).to_string(index=False))
    assert (jobs["State"] == "COMPLETED").all(), jobs
    counts = jobs["rule"].value_counts().to_dict()
    config = slurm_run["config"]
    n_ckpts = len(config["finetune"]["epoch_fractions"])
    assert counts["tokenize"] == 1 and counts["finetune"] == 1 and counts["baseline"] == 1
    assert counts["extract"] == n_ckpts * config["extract"]["shards"]
    assert counts["feature_manifest"] == n_ckpts and counts["train_heads"] == n_ckpts
    assert not LOCAL_RULES & set(counts), "light rules must run on the submit host"

    # the linear model on the task's embeddings is scikit-learn's: the one peer with no GPU
    linear_peer = jobs["Comment"].str.contains(r"^rule_peer_wildcards_.*_(?:embedding|cosine)_\d+$")
    gpu_jobs = jobs[jobs["rule"].isin(GPU_RULES) & ~linear_peer]
    cpu_jobs = jobs[~jobs["rule"].isin(GPU_RULES) | linear_peer]
    assert linear_peer.any(), jobs
    assert gpu_jobs["ReqTRES"].str.contains(r"gres/gpu=1\b").all(), gpu_jobs
    assert gpu_jobs["AllocTRES"].str.contains(r"gres/gpu=1\b").all(), gpu_jobs
    assert not cpu_jobs["ReqTRES"].str.contains("gres/gpu").any(), cpu_jobs
    # the memory each job computed from the config (printed by Snakemake) reached SLURM
    for rule in ("finetune", "extract", "train_heads"):
        planned = re.search(rf"rule {rule}:.*?resources: [^\n]*?mem_mb=(\d+)", slurm_run["log"], re.S)
        assert planned, f"no resources line for {rule}"
        assert jobs[jobs["rule"] == rule]["ReqTRES"].str.contains(rf"mem={planned.group(1)}M").all(), rule


def test_gpu_model_from_the_environment_reaches_sbatch(slurm_run, cluster):
    """BERTVISION_SLURM_GPU_MODEL turns the request into --gpus=<model>:1 (scontrol keeps the
    job's TRES-per-job string for MinJobAge seconds)."""
    if not cluster["gpu_model"]:
        pytest.skip("the node's GPU GRES has no type")
    jobs = sacct_jobs(slurm_run["run_id"])
    job = jobs[jobs["rule"] == "finetune"]["JobID"].iloc[0]
    show = slurm_cmd("scontrol", "show", "job", job)
    if show.returncode != 0:
        pytest.skip(f"slurmctld no longer holds job {job}: {show.stderr.strip()}")
    assert f"TresPerJob=gres:gpu:{cluster['gpu_model']}:1" in show.stdout, show.stdout


def test_results_equal_a_local_run(slurm_run):
    local = pd.read_csv(slurm_run["local"] / "results" / "tables" / "glue.csv")
    remote = pd.read_csv(slurm_run["slurm"] / "results" / "tables" / "glue.csv")
    assert len(local) > 0
    pd.testing.assert_frame_equal(remote, local, check_exact=False, rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def retry_run(runs):
    """MRPC with a simulated GPU memory limit of 4 rows per forward pass (batches of 8 do not
    fit), and an optuna search of lp whose 2 workers are SLURM jobs."""
    return runs["retry"]


def test_out_of_memory_is_resubmitted_with_micro_batches_and_more_memory(retry_run):
    jobs = sacct_jobs(retry_run["run_id"])
    jobs["id"] = jobs["JobID"].astype(int)
    for rule in ("finetune", "baseline", "extract"):
        attempts = jobs[jobs["rule"] == rule].sort_values("id")
        assert list(attempts["State"]) == ["FAILED", "COMPLETED"], attempts
        memory = attempts["ReqTRES"].str.extract(r"mem=(\d+)M", expand=False).astype(int).tolist()
        assert memory[1] > 1.5 * memory[0], attempts  # the resubmission asks for more memory
        assert attempts["ReqTRES"].str.contains(r"gres/gpu=1\b").all()
    log = (retry_run["slurm"] / "logs/finetune/mrpc/tiny-ft1-ckpt-1.log").read_text()
    assert "rank 0 of 1), 2 micro-batch(es) per batch" in log  # the log of the attempt that succeeded
    assert (retry_run["slurm"] / "results/tables/glue.csv").exists()


def test_two_search_workers_ran_as_slurm_jobs_on_one_study(retry_run):
    jobs = sacct_jobs(retry_run["run_id"])
    workers = jobs[jobs["rule"] == "search_worker"]
    assert len(workers) == 2 and (workers["State"] == "COMPLETED").all(), workers
    assert not workers["ReqTRES"].str.contains("gres/gpu").any()
    best = json.loads((retry_run["slurm"] / "search/tiny/mrpc/ft1/ckpt-1/lp/best.json").read_text())
    assert best["trials"]["COMPLETE"] + best["trials"]["PRUNED"] == 4
    assert best["trial_numbers"] == [0, 1, 2, 3]
    head = json.loads((retry_run["slurm"] / "heads/tiny/mrpc/ft1/ckpt-1/lp/seed1/metrics.json").read_text())
    assert head["training_settings"]["learning_rate"] == pytest.approx(best["best_params"]["learning_rate"])
