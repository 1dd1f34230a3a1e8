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
        }
    )


def all_bert_metrics():
    return [
        CKPT_FILE.format(model=m, task=t, ftseed=s, frac=f, file="eval_metrics.json")
        for m in S.models
        for t in S.tasks
        for s in FT_SEEDS
        for f in S.fractions
    ]


def all_head_dirs():
    return [
        HEADS_DIR.format(model=m, task=t, ftseed=s, frac=f)
        for m in S.models
        for t in S.tasks
        for s in FT_SEEDS
        for f in S.fractions
    ]


def all_manifests():
    return [
        MANIFEST.format(model=m, task=t, ftseed=s, frac=f)
        for m in S.models
        for t in S.tasks
        for s in FT_SEEDS
        for f in S.fractions
    ]


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
