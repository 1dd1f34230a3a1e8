"""Cost accounting: what each result cost to produce, from the metrics files, the feature
manifests and Snakemake's benchmark files. The BERTVision path to a checkpoint costs the
partial fine-tuning up to it + the extraction of its features + the head's training; it is
set against BERT's own head at the checkpoint with the best selection score (dev scores are
reported, never compared). Beside it, the whole cost of choosing among the heads
(``reporting.whole_cost``): at the row's checkpoint, and over every checkpoint. The verdict
against full fine-tuning is the summary's (``reporting/summary.py``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.files import read_json
from bertvision.jobs import Job
from bertvision.layout import Checkpoint, source_checkpoint
from bertvision.registry.tasks import get_task
from bertvision.reporting.bert_records import is_scored
from bertvision.reporting.markdown import markdown_table
from bertvision.reporting.whole_cost import CHECKPOINT_KEYS, SEED_KEYS, JobSeconds, SelectionCost


def feature_bytes(manifests) -> dict[tuple, float]:
    """(model, task, ft seed, checkpoint) -> bytes of its feature shards (all splits)."""
    out = {}
    for path in manifests:
        m = read_json(path)
        src = m["source"]
        key = (src["model"], src["task"], int(src["ft_seed"]), source_checkpoint(m))
        out[key] = float(sum(sh["bytes"] for e in m["splits"].values() for sh in e["shards"]))
    return out


def storage_cost(record: dict, jobs: JobSeconds, sizes: dict) -> tuple[float, float]:
    """(extraction seconds, feature bytes) behind a head record: the run's extraction jobs and
    shards, or none for streamed states (``store: false``), whose encoder passes are in the
    head's own seconds."""
    if not record.get("features_stored", True):
        return 0.0, 0.0
    src = record["source"]
    key = (src["model"], record["task"], int(src["ft_seed"]), source_checkpoint(record))
    return jobs.extract(*key), sizes.get(key, np.nan)


def _std(values: pd.Series) -> float:
    """Sample std over head seeds; NaN for one seed."""
    return float(values.std(ddof=1)) if len(values) > 1 else np.nan


def _mean_std(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f}" if np.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def cost_table(bert_metrics, head_metrics, manifests, jobs: list[Job]) -> pd.DataFrame:
    """One row per fine-tuning seed, checkpoint and head. ``jobs``: every job the picks ran
    (``whole_cost.JobSeconds``), whose benchmark files give their times."""
    job_seconds = JobSeconds(jobs)
    sizes = feature_bytes(manifests)
    bert = pd.DataFrame(
        [
            {
                "model_name": r["model"],
                "task": r["task"],
                "ft_seed": r["seed"],
                "checkpoint": Checkpoint.named(r["checkpoint"]).fraction,
                "finetune_s": r["train_seconds"],
                "score": get_task(r["task"]).headline(r["metrics"]) if is_scored(r) else np.nan,
                "selection": get_task(r["task"]).primary_score(r["metrics"], "selection") if is_scored(r) else np.nan,
                "device": r["device"],
            }
            for r in map(read_json, bert_metrics)
        ]
    )
    heads = pd.DataFrame(
        [
            {
                "task": r["task"],
                "model_name": r["source"]["model"],
                "ft_seed": int(r["source"]["ft_seed"]),
                "checkpoint": source_checkpoint(r).fraction,
                "model": r["head"],
                "head_s": r["seconds"],
                **job_seconds.parts(r),
                "score": get_task(r["task"]).headline(r["metrics"]),
                "trainable_params": r["parameters"],
                "parameter_percent": r["parameter_percent"],
                "encoder_params": r["encoder_parameters"],
                "features": "stored" if r.get("features_stored", True) else "streamed",
                **dict(zip(("extract_s", "feature_bytes"), storage_cost(r, job_seconds, sizes))),
            }
            for r in map(read_json, head_metrics)
        ]
    )
    if heads.empty or bert.empty:
        return pd.DataFrame()
    finetune = bert[["model_name", "task", "ft_seed", "checkpoint", "finetune_s"]]
    spent = heads.merge(finetune, on=["model_name", "task", "ft_seed", "checkpoint"], how="left")
    whole = SelectionCost(spent.rename(columns={"model_name": "backbone"}))
    at_checkpoint = whole.checkpoints.set_index(CHECKPOINT_KEYS)["whole_s"]
    over_checkpoints = whole.seeds.set_index(SEED_KEYS)["whole_s"]
    rows = []
    keys = ["task", "model_name", "ft_seed", "checkpoint", "model"]
    for (task, model_name, ft, checkpoint, head), g in heads.groupby(keys, sort=False):
        b = bert[(bert["model_name"] == model_name) & (bert["task"] == task) & (bert["ft_seed"] == ft)]
        at = b[b["checkpoint"] == checkpoint].iloc[0]
        # the reference checkpoint is chosen on selection; without selection scores, the last one
        best = b.loc[b["selection"].idxmax()] if b["selection"].notna().any() else b.loc[b["checkpoint"].idxmax()]
        ext = float(g["extract_s"].iloc[0])
        head_s = float(g["head_s"].mean())
        head_s_std = _std(g["head_s"])
        rows.append(
            {
                "backbone": model_name,
                "task": task,
                "ft_seed": ft,
                "checkpoint": checkpoint,
                "model": head,
                "n": len(g),
                "score": float(g["score"].mean()),
                "score_std": _std(g["score"]),
                "trainable_params": int(g["trainable_params"].iloc[0]),
                "parameter_percent": float(g["parameter_percent"].iloc[0]),
                "finetune_s": float(at["finetune_s"]),
                "extract_s": ext,
                "head_s": head_s,
                "head_s_std": head_s_std,
                "bertvision_s": float(at["finetune_s"]) + ext + head_s,
                "bertvision_s_std": head_s_std,  # the rest is the same for every head seed
                "search_s": float(g["search_s"].iloc[0]),  # this head's study at this checkpoint
                # everything run to choose among the heads at this checkpoint, and over every one
                "checkpoint_whole_s": at_checkpoint.get((model_name, task, ft, checkpoint), np.nan),
                "selection_whole_s": over_checkpoints.get((model_name, task, ft), np.nan),
                "feature_bytes": float(g["feature_bytes"].iloc[0]),
                "features": g["features"].iloc[0],
                "bert_score": float(at["score"]),
                "bert_pick_checkpoint": float(best["checkpoint"]),
                "bert_pick_score": float(best["score"]),
                "bert_pick_finetune_s": float(best["finetune_s"]),
                "device": at["device"],
            }
        )
    return pd.DataFrame(rows).sort_values(["backbone", "task", "ft_seed", "checkpoint", "model"]).reset_index(drop=True)


def cost_markdown(costs: pd.DataFrame) -> str:
    parts = [
        "# Cost of each result",
        "",
        "Seconds of wall time on the device in the last column (a GPU's time when it ran on one). "
        "BERTVision = fine-tuning to the checkpoint + extracting its features + training the head. "
        "Head scores and seconds are mean ± sample std over the head seeds (n). Streamed states "
        "(`store: false`) are extracted by nobody: the head's seconds include its share of the encoder's "
        "passes, and no bytes are stored. "
        "It is set against BERT's own head at the checkpoint with the best "
        "**selection** score (`BERT's pick`). The comparison with full fine-tuning is `summary.md`'s. "
        "`search s`: the head's optuna study at the checkpoint (its jobs). `checkpoint whole s`: the wall time of "
        "every job run to choose among the heads at the checkpoint (the fine-tuning jobs up to it, its extraction, "
        "its head job with every head and head seed, every search, the race's decision); the heading's whole cost "
        "is that over every checkpoint (`summary.md` states its verdict on it).",
        "",
    ]
    if costs.empty:
        return "\n".join(parts + ["No head results yet.", ""])
    for (backbone, task, ft), block in costs.groupby(["backbone", "task", "ft_seed"], sort=False):
        metric = get_task(task).primary_metric
        digits = 2 if get_task(task).metric_scale() > 1 else 3
        first = block.iloc[0]
        parts.append(
            f"## {task} ({backbone}, fine-tuning seed {ft}; {metric}; BERT's pick: "
            f"{first['bert_pick_score']:.{digits}f} at {first['bert_pick_checkpoint']:g} epochs, "
            f"{first['bert_pick_finetune_s']:.1f} s of fine-tuning; whole cost of a pick over every checkpoint: "
            f"{first['selection_whole_s']:.1f} s)"
        )
        parts.append("")
        rows = [
            [
                f"{r.checkpoint:g}",
                r.model,
                str(r.n),
                _mean_std(r.score, r.score_std, digits),
                "" if np.isnan(r.bert_score) else f"{r.bert_score:.{digits}f}",  # checkpoint 0: BERT's head untrained
                f"{r.parameter_percent:.3f}",
                f"{r.finetune_s:.1f}",
                f"{r.extract_s:.1f}",
                _mean_std(r.head_s, r.head_s_std, 1),
                _mean_std(r.bertvision_s, r.bertvision_s_std, 1),
                f"{r.search_s:.1f}",
                f"{r.checkpoint_whole_s:.1f}",
                f"{r.feature_bytes / 2**20:.1f}",
                r.features,
                r.device,
            ]
            for r in block.itertuples()
        ]
        parts.append(
            markdown_table(
                [
                    "epochs",
                    "head",
                    "n",
                    "head score",
                    "BERT score",
                    "% params",
                    "fine-tune s",
                    "extract s",
                    "head s",
                    "BERTVision s",
                    "search s",
                    "checkpoint whole s",
                    "features MiB",
                    "states",
                    "device",
                ],
                rows,
            )
        )
        parts.append("")
    return "\n".join(parts)
