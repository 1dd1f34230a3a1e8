"""Degenerate runs: a model that predicts one class for every example, a regressor with a
constant output, a QA model that abstains on every question, or a score at chance level
(MCC or correlation ~ 0). The tables flag such runs instead of averaging them in silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.registry.metrics import get_metric
from bertvision.registry.task_spec import TaskSpec

CHANCE_TOLERANCE = 0.02


def _constant(predictions: pd.Series, kind: str) -> str | None:
    if kind == "span":
        return "abstains on every question" if (predictions == "").all() else None
    if kind == "regression":
        return "constant output" if float(np.std(predictions.to_numpy(dtype=np.float64))) < 1e-6 else None
    return f"predicts only class {predictions.iloc[0]}" if predictions.nunique() == 1 else None


def prediction_flags(predictions_file: Path, task: TaskSpec) -> dict[str, str]:
    """Evaluation split -> why the run's predictions there are degenerate (absent when fine)."""
    predictions = pd.read_parquet(predictions_file, columns=["split", "prediction"])
    flags = {}
    for split in task.eval_splits:
        rows = predictions.loc[predictions["split"] == split, "prediction"]
        if len(rows) and (reason := _constant(rows, task.kind)):
            flags[split] = reason
    return flags


def metric_flag(task: TaskSpec, metric: str, value: float) -> str | None:
    if get_metric(task.kind, metric).zero_is_chance and abs(value) < CHANCE_TOLERANCE:
        return f"{metric} ≈ 0"
    return None
