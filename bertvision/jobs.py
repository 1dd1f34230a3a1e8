"""The pipeline's jobs, each a rule and its keys, with the log and benchmark files the layout
gives it; and the jobs behind a set of runs, whose benchmark files the timing and whole-cost
tables read."""

from __future__ import annotations

from dataclasses import dataclass

from bertvision.layout import Run, benchmark, log


@dataclass(frozen=True)
class Job:
    """One job of a rule, named by its keys."""

    rule: str
    keys: dict

    @property
    def benchmark(self) -> str:
        return benchmark(self.rule).format(**self.keys)

    @property
    def log(self) -> str:
        return log(self.rule).format(**self.keys)


def baseline_job(model: str, task: str, seed: int) -> Job:
    return Job("baseline", {"task": task, "model": model, "seed": seed})


def peer_job(model: str, task: str, peer: str, seed: int) -> Job:
    return Job("peer", {"task": task, "model": model, "peer": peer, "seed": seed})


def embed_job(model: str, task: str) -> Job:
    return Job("embed", {"task": task, "model": model})


def timing_jobs(runs: list[Run], n_shards: int, baselines: tuple[Job, ...] = ()) -> list[Job]:
    """Every job of the main pipeline behind ``runs`` (download to train_heads, BERT's scoring
    included), once each, and the ``baselines`` (full fine-tuning's and the peers' jobs). A run's fine-tuning went
    through every earlier checkpoint of its task among ``runs``, so those fine-tuning jobs of its
    seed count too (a later seed's checkpoint 0, whose states are the first seed's, among them)."""
    jobs: dict[tuple, Job] = {}
    checkpoints: dict[tuple, set] = {}
    for run in runs:
        checkpoints.setdefault((run.model, run.task), set()).add(run.checkpoint)

    def add(rule: str, **keys):
        jobs.setdefault((rule, *sorted(keys.items())), Job(rule, keys))

    for run in runs:
        add("download", task=run.task)
        add("tokenize", task=run.task, model=run.model)
        for earlier in sorted(c for c in checkpoints[(run.model, run.task)] if c <= run.checkpoint):
            add("finetune", **{**run.keys, "checkpoint": earlier})
        if run.checkpoint.fraction > 0:
            add("score_bert", **run.keys)
        if run.stored:
            for shard in range(n_shards):
                add("extract", **run.keys, shard=shard)
            add("feature_manifest", **run.keys)
        add("train_heads", **run.keys)
    return list(jobs.values()) + list(baselines)
