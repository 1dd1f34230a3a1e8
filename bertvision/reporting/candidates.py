"""The candidates the summary chooses among: one row per trained model and seed (full
fine-tuning, BERT at each checkpoint, every head and head + BERT ensemble) with its selection
and dev scores, trainable parameters, own seconds and the parts of its whole cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.evaluation.ensemble import ensemble_rules, prediction_column
from bertvision.files import read_json
from bertvision.jobs import Job
from bertvision.layout import (
    BASELINE_PREDICTIONS,
    BERT_PREDICTIONS,
    HEAD_PREDICTIONS,
    PEER_PREDICTIONS,
    Checkpoint,
    beside,
    source_checkpoint,
)
from bertvision.registry.tasks import get_task
from bertvision.reporting.bert_records import is_scored
from bertvision.reporting.costs import feature_bytes, storage_cost
from bertvision.reporting.results import BERT, ensemble_name, ensemble_parameters, raced_out, repeats_frozen_run
from bertvision.reporting.whole_cost import JobSeconds
from bertvision.runtime.precision import computed_in

FULL_FT = "full fine-tuning"
PEER = "peer"


def sample_std(values: pd.Series) -> float:
    """The sample std over seeds; NaN for one run (a spread one run cannot measure)."""
    return values.std(ddof=1) if len(values) > 1 else np.nan


# A configuration's runs (its seeds) as one row: the summary's and the methods table's columns.
SEED_AGGREGATES = {
    "dev_mean": ("dev", "mean"),
    "dev_std": ("dev", sample_std),
    "n": ("dev", "size"),
    # missing on any run: missing (no candidate), as the race counts it (``reporting.ranking``)
    "selection_mean": ("selection", lambda v: v.mean(skipna=False)),
    "trainable_params": ("trainable_params", "first"),
    "encoder_params": ("encoder_params", "first"),
}


def _dev_facts(task, metrics: dict) -> dict:
    """The reported split's constant score and (answerability) uncovered-question count."""
    dev = metrics.get(task.eval_splits[0], {})
    return {k: dev.get(k, np.nan) for k in ("constant_score", "answerable_no_window")}


def _encoder_row(record: dict, kind: str, checkpoint: Checkpoint | None, jobs: JobSeconds) -> dict:
    """A summary row of a fine-tuned encoder's own head (full fine-tuning or BERT at a checkpoint).
    Its whole seconds are its jobs': full fine-tuning's job trains every epoch and scores each
    before it keeps one; BERT at a checkpoint chooses nothing (its fine-tuning jobs up to it and
    its scoring, ``JobSeconds.bert_at``)."""
    task = get_task(record["task"])
    if kind == FULL_FT:
        whole = jobs.baseline(record["model"], task.name, record["seed"])
    else:
        whole = jobs.bert_at(record, checkpoint)
    return {
        "backbone": record["model"],
        "task": task.name,
        "kind": kind,
        "checkpoint": np.nan if checkpoint is None else checkpoint.fraction,
        "model": kind,
        "selection": task.primary_score(record["metrics"], "selection"),
        "dev": task.headline(record["metrics"]),
        "trainable_params": record["encoder_parameters"],
        "encoder_params": record["encoder_parameters"],
        "seconds": record["train_seconds"],
        "whole_seconds": whole,
        "feature_bytes": 0.0,
        "device": record["device"],
        "precision": record.get("scored_in") or record.get("precision"),  # BERT's: what scored it
        **_dev_facts(task, record["metrics"]),
    }


def _peer_row(record: dict, jobs: JobSeconds) -> dict:
    """A peer's row (``stages/peer``): its chosen settings' scores, its jobs' whole seconds."""
    task = get_task(record["task"])
    return {
        "backbone": record["model"],
        "task": task.name,
        "kind": PEER,
        "checkpoint": np.nan,
        "model": record["label"],
        "peer": record["peer"],
        "deterministic": bool(record["deterministic"]),
        "selection": task.primary_score(record["metrics"], "selection"),
        "dev": task.headline(record["metrics"]),
        "trainable_params": record["trainable_parameters"],
        "encoder_params": record["encoder_parameters"],
        "seconds": record["train_seconds"],
        "whole_seconds": jobs.peer(record),
        "feature_bytes": 0.0,
        "device": record["device"],
        "precision": record.get("precision"),
        **_dev_facts(task, record["metrics"]),
    }


def _records(paths) -> list[tuple[Path, dict]]:
    return [(Path(p), read_json(p)) for p in paths]


def candidate_runs(
    baseline_metrics: list[Path],
    bert_metrics: list[Path],
    head_metrics: list[Path],
    manifests: list[Path],
    jobs: list[Job],
    peer_metrics: list[Path] = (),
) -> pd.DataFrame:
    """One row per trained model (and seed): its selection and dev score on the task's primary
    metric, trainable parameters, seconds to produce it and feature bytes; a head's run also the
    jobs of its checkpoint's whole cost (``reporting.whole_cost``). ``jobs``: every job the
    picks ran (``whole_cost.JobSeconds``), whose benchmark files give their times."""
    spent = JobSeconds(jobs)
    rows = [
        {
            **_encoder_row(r, FULL_FT, None, spent),
            "kept_epoch": r["best_epoch"],
            "epochs": r["epochs"],
            "predictions": (beside(path, BASELINE_PREDICTIONS), prediction_column()),
        }
        for path, r in _records(baseline_metrics)
    ]
    rows += [
        {**_peer_row(r, spent), "predictions": (beside(path, PEER_PREDICTIONS), prediction_column())}
        for path, r in _records(peer_metrics)
    ]
    bert = {}
    for path, r in _records(bert_metrics):
        key = (r["model"], get_task(r["task"]).name, int(r["seed"]), Checkpoint.named(r["checkpoint"]))
        bert[key] = r
        if is_scored(r):
            rows.append(
                {
                    **_encoder_row(r, BERT, key[3], spent),
                    "predictions": (beside(path, BERT_PREDICTIONS), prediction_column()),
                }
            )
    sizes = feature_bytes(manifests)
    records = sorted(_records(head_metrics), key=lambda pr: int(pr[1]["source"]["ft_seed"]))
    frozen_seen: set[tuple] = set()
    for path, r in records:
        task, src = get_task(r["task"]), r["source"]
        key = (src["model"], task.name, int(src["ft_seed"]), source_checkpoint(r))
        repeat = repeats_frozen_run(r, frozen_seen)
        at = bert.get(key)
        extract_s, stored_bytes = storage_cost(r, spent, sizes)
        finetune_s = at["train_seconds"] if at else np.nan
        common = {
            "backbone": key[0],
            "task": task.name,
            "ft_seed": key[2],
            "checkpoint": key[3].fraction,
            "head": r["head"],
            "seconds": finetune_s + extract_s + r["seconds"],
            "finetune_s": finetune_s,
            "extract_s": extract_s,
            "head_s": r["seconds"],
            **spent.parts(r),
            "whole_seconds": np.nan,  # the row's choice decides it (summary_table)
            "feature_bytes": stored_bytes,
            "encoder_params": r["encoder_parameters"],
            "device": r["device"] if at is None else at["device"],
            # of the encoder that computed the head's states, and its runtime
            "precision": computed_in(r.get("states_precision"), r.get("states_backend")),
            # stopped by its job's race (heads.race): its seconds count, it is never picked
            "raced_out": raced_out(r),
            "head_selection": (r.get("race") or {}).get("protocol", "grid"),
            "pair": r.get("pair") or "joint",  # a pair task's texts as the head's states saw them
            "searched": r.get("search") is not None,  # its parameters the optuna search's best
            **_dev_facts(task, r["metrics"]),
        }
        rows.append(
            {
                **common,
                "kind": "head",
                "model": r["head"],
                "ensemble": None,
                "repeat": repeat,
                "dev": task.headline(r["metrics"]),
                "selection": task.primary_score(r["metrics"], "selection"),
                "trainable_params": r["parameters"],
                "predictions": (beside(path, HEAD_PREDICTIONS), prediction_column()),
            }
        )
        for how in ensemble_rules(task):
            ens = r.get("ensembles", {}).get(how)
            if ens:
                rows.append(
                    {
                        **common,
                        "kind": "ensemble",
                        "model": ensemble_name(r["head"], how),
                        "ensemble": how,
                        "selection": task.primary_score(ens, "selection"),
                        "dev": task.headline(ens),
                        "trainable_params": ensemble_parameters(r),
                        "predictions": (beside(path, HEAD_PREDICTIONS), prediction_column(how)),
                    }
                )
    return pd.DataFrame(rows)
