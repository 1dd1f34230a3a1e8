"""Helpers shared by the rules: config validation, settings as JSON params, target lists."""

import json
import os
import sys
from pathlib import Path

from bertvision.config import Settings, validate_config
from bertvision.tasks import get_task, splits_of

validate_config(config, source="workflow config")
S = Settings(config)
# Rules call the `bertvision` command of the environment running Snakemake, even when that
# environment is not activated (e.g. `.venv/bin/snakemake`).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
ENV = "../envs/bertvision.yaml"


wildcard_constraints:
    model=r"[A-Za-z0-9_.-]+",
    task=r"[a-z0-9]+",
    frac=r"[0-9.]+",
    ftseed=r"\d+",
    shard=r"\d+",
    head=r"[A-Za-z0-9_.-]+",
    worker=r"\d+",
    pct=r"[0-9.]+",


def as_json(obj):
    return json.dumps(obj, sort_keys=True)


N_SHARDS = int(config["extract"]["shards"])
FT_SEEDS = list(config["finetune"]["seeds"])
HEAD_SEEDS = list(config["heads"]["seeds"])
THREADS = int(config["resources"]["threads"])
GPU = int(config["resources"]["gpu_rules"])

CKPT_FILE = "models/{model}/{task}/ft{ftseed}/ckpt-{frac}/{file}"
SHARD_DIR = "features/{model}/{task}/ft{ftseed}/ckpt-{frac}/shard-{shard}-of-{n_shards}"
MANIFEST = "features/{model}/{task}/ft{ftseed}/ckpt-{frac}/manifest.json"
HEADS_DIR = "heads/{model}/{task}/ft{ftseed}/ckpt-{frac}"
SEARCH_DIR = "search/{model}/{task}/ft{ftseed}/ckpt-{frac}/{head}"
SEARCH_WORKER = f"{SEARCH_DIR}/worker-{{worker}}.json"
SEARCH_BEST = f"{SEARCH_DIR}/best.json"
STUDY_JOURNAL = f"{SEARCH_DIR}/study.journal"
SUBSET_HEADS_DIR = "heads-data/{model}/{task}/ft{ftseed}/ckpt-{frac}/data-{pct}"
TRANSFER_FILE = "transfer/{model}/{task}/ft{ftseed}.json"
SEARCH_WORKERS = int(config["search"]["workers"])


def source_files(wildcards):
    """The local files a download reads, so that replacing one reruns the download."""
    from bertvision.data.download import local_source_files

    return [str(p) for p in local_source_files(get_task(wildcards.task), S.download(wildcards.task))]


def shard_dirs(wildcards):
    return [SHARD_DIR.format(**wildcards, shard=i, n_shards=N_SHARDS) for i in range(N_SHARDS)]


def extract_attrs(wildcards):
    task = get_task(wildcards.task)
    return as_json(
        {
            "model": wildcards.model,
            "task": wildcards.task,
            "checkpoint": wildcards.frac,
            "ft_seed": int(wildcards.ftseed),
            "label_kind": task.kind,
            # Only when every token is stored for an example task, so [CLS] extractions keep their params.
            **({"features": "tokens"} if S.token_features(wildcards.task) else {}),
        }
    )


def all_bert_metrics():
    return for_every_run(CKPT_FILE, file="eval_metrics.json")


def all_head_dirs():
    return for_every_run(HEADS_DIR)


def all_manifests():
    return for_every_run(MANIFEST)


def all_benchmarks():
    """Benchmark files of every job the tables depend on (each job writes one)."""
    files = [f"benchmarks/download/{t}.tsv" for t in S.tasks]
    for m in S.models:
        for t in S.tasks:
            files.append(f"benchmarks/tokenize/{t}/{m}.tsv")
            for s in FT_SEEDS:
                files.append(f"benchmarks/finetune/{t}/{m}-ft{s}.tsv")
                for f in S.fractions:
                    files += [f"benchmarks/extract/{t}/{m}-ft{s}-ckpt{f}-{i}.tsv" for i in range(N_SHARDS)]
                    files.append(f"benchmarks/feature_manifest/{t}/{m}-ft{s}-ckpt{f}.tsv")
                    files.append(f"benchmarks/train_heads/{t}/{m}-ft{s}-ckpt{f}.tsv")
    return files


def study_storage(wildcards):
    """The configured RDB URL, or a journal file beside the study's worker records."""
    return config["search"]["storage"] or STUDY_JOURNAL.format(**wildcards)


def searched_best(wildcards, heads=None):
    """head name -> best.json of the heads searched for this task at this checkpoint (of
    ``heads`` only, when given)."""
    fields = dict(wildcards)
    return {
        head: SEARCH_BEST.format(**{**fields, "head": head})
        for head in S.search_heads(fields["task"])
        if heads is None or head in heads
    }


def searched_args(wildcards, input):
    """`--searched` arguments: HEAD=search/.../HEAD/best.json."""
    return " ".join(f"{Path(path).parent.name}={path}" for path in input.searched)


def every_run(tasks=None, fractions=None):
    """Wildcards of every model x task x fine-tuning seed x checkpoint."""
    return [
        {"model": m, "task": t, "ftseed": s, "frac": f}
        for m in S.models
        for t in (S.tasks if tasks is None else tasks)
        for s in FT_SEEDS
        for f in (S.fractions if fractions is None else fractions)
    ]


def for_every_run(pattern, tasks=None, fractions=None, **extra):
    """``pattern`` formatted for every model x task x fine-tuning seed x checkpoint."""
    return [pattern.format(**run, **extra) for run in every_run(tasks, fractions)]


def all_search_results():
    return [path for run in every_run() for path in searched_best(run).values()]


def all_subset_head_dirs():
    return [
        path
        for pct in S.data_fractions()
        for path in for_every_run(
            SUBSET_HEADS_DIR, tasks=S.data_fraction_tasks(), fractions=S.data_fraction_checkpoints(), pct=pct
        )
    ]


def all_transfer_files():
    return [TRANSFER_FILE.format(model=m, task=t, ftseed=s) for m in S.models for t in S.transfer_tasks() for s in FT_SEEDS]


# Cluster settings from the environment (README, "Run on a cluster"). The GPU rules ask for
# --gpus=<model>:<n> when BERTVISION_SLURM_GPU_MODEL is set, --gpus=<n> otherwise; rules that
# ask for no GPU never get a model (the slurm plugin would turn a model alone into one GPU).
GPU_MODEL = (os.environ.get("BERTVISION_SLURM_GPU_MODEL") or None) if GPU > 0 else None


# download reads local files or the hub: it runs on the submit host, which has the network
# that compute nodes often lack, and it is light. tokenize and feature_manifest stay jobs:
# at paper scale they read GBs (the manifest checksums every feature shard).
localrules:
    download,


def micro_batches(wildcards, attempt):
    """Attempt n (a resubmission after running out of GPU memory) splits each batch into
    2^(n-1) micro-batches: same effective batch, less memory per pass."""
    return 2 ** (attempt - 1)


def launcher(wildcards, resources):
    """`bertvision`, or `torchrun` with one data-parallel rank per GPU when the job has more
    than one (fine-tuning only)."""
    gpus = int(resources.gpu)
    return f"torchrun --standalone --nproc-per-node {gpus} -m bertvision" if gpus > 1 else "bertvision"


# --- what each job asks the scheduler for, computed from the config (bertvision/resources.py)
from functools import lru_cache

from bertvision import resources as requests


@lru_cache(maxsize=None)
def encoder_shape(model):
    return requests.EncoderShape.of(S.pretrained(model))


def train_rows(task):
    """Rows the training split will hold: the configured subsample or the published size."""
    rows = S.task_overrides(task).get("train_size") or requests.PUBLISHED_TRAIN_ROWS[task]
    return int(rows * (1 - float(config["data"]["selection_fraction"])))


def finetune_request(key):
    def request(wildcards, attempt):
        ft = S.finetune(wildcards.task)
        epochs = ft["schedule_epochs"] or max(ft["epoch_fractions"])
        return requests.finetune_request(
            encoder_shape(wildcards.model), ft["batch_size"], S.max_length(wildcards.task),
            train_rows(wildcards.task), epochs, GPU, attempt,
        )[key]

    return request


def extract_request(key):
    def request(wildcards, attempt):
        ex = S.extract()
        return requests.extract_request(
            encoder_shape(wildcards.model), ex["batch_size"], ex["block_rows"], ex["block_tokens"],
            S.max_length(wildcards.task), train_rows(wildcards.task), N_SHARDS,
            S.feature_level(wildcards.task) == "tokens", GPU, attempt,
        )[key]

    return request


def heads_request(key, runs):
    """``runs(wildcards)``: head trainings the job does (heads x seeds, or trials)."""

    def request(wildcards, attempt):
        training = S.head_training(wildcards.task)
        return requests.heads_request(
            encoder_shape(wildcards.model), train_rows(wildcards.task), S.max_length(wildcards.task),
            S.feature_level(wildcards.task) == "tokens", training["in_memory_max_mb"], runs(wildcards),
            training["max_epochs"], attempt,
        )[key]

    return request


def head_runs(wildcards):
    return len(S.task_heads(wildcards.task)) * len(HEAD_SEEDS)


def subset_runs(wildcards):
    return len(S.data_fraction_heads(wildcards.task)) * len(HEAD_SEEDS)


def trials_per_worker(wildcards):
    return -(-S.search()["trials"] // SEARCH_WORKERS)


def one_run(wildcards):
    return 1
