"""The table of BERT's own fine-tuning curve (``experiments.bert_curve``): the task's primary
metric on every scored split at every point, mean ± std over seeds. Every number comes from a
``bert_curve`` record."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bertvision.files import read_json
from bertvision.registry.tasks import get_task
from bertvision.reporting.experiments import over_seeds, page
from bertvision.reporting.markdown import fmt, markdown_table

COLUMNS = ["backbone", "task", "split", "epochs", "metric", "mean", "std", "n"]


def bert_curve_table(curve_files: list[Path]) -> pd.DataFrame:
    """One row per backbone, task, scored split and point (epochs): the task's primary metric,
    mean, sample std and count over seeds."""
    rows = []
    for path in curve_files:
        record = read_json(path)
        task = get_task(record["task"])
        for point in record["curve"]:
            for split in point["metrics"]:
                rows.append(
                    {
                        "backbone": record["model"],
                        "task": task.name,
                        "split": split,
                        "epochs": float(point["epochs"]),
                        "value": task.primary_score(point["metrics"], split),
                    }
                )
    keys = ["backbone", "task", "split", "epochs"]
    return over_seeds(pd.DataFrame(rows, columns=[*keys, "value"]), keys, sort=True)[COLUMNS]


@page("BERT's fine-tuning curve", "BERT fine-tuning curve configured (experiments.bert_curve.tasks)")
def bert_curve_markdown(table: pd.DataFrame) -> list[str]:
    """Per backbone and task: the score at each point (rows) on each scored split (columns)."""
    parts = [
        "Full fine-tuning with the baseline's settings, its learning-rate schedule spanning the last "
        "point, the model scored at every point on selection and dev (the original paper's Figure 1). "
        "Nothing is chosen from the curve. Mean ± std over seeds (n).",
        "",
    ]
    for (backbone, task), block in table.groupby(["backbone", "task"], sort=True):
        spec = get_task(task)
        splits = [s for s in ("selection", *spec.eval_splits) if s in set(block["split"])]
        parts += [f"## {task} ({backbone}; {spec.primary_metric})", ""]
        rows = []
        for epochs, at in block.groupby("epochs", sort=True):
            by = at.set_index("split")
            cells = [
                fmt(by.at[s, "mean"], by.at[s, "std"], spec.metric_scale()) if s in by.index else "" for s in splits
            ]
            rows.append([f"{epochs:g}", *cells, str(int(at["n"].max()))])
        parts += [markdown_table(["epochs", *splits, "n"], rows), ""]
    return parts
