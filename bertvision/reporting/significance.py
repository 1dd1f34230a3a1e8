"""How much of a difference on dev another draw of dev's rows could undo: a paired bootstrap over
the reported split's examples (Efron and Tibshirani 1993; for NLP, Koehn 2004 and Dror et al.
2018). The seeds' spread says how a method varies with its seed; it says nothing of the few hundred
rows RTE's or MRPC's dev holds, which can move a difference by several points on their own.

Both methods are scored on the same resampled rows (paired), each as the mean of its runs' scores
(its seeds), with the task's primary metric, so the interval is that of the difference the summary
reports. The resampling is seeded: the same predictions give the same interval."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bertvision.registry.metrics import get_metric

RESAMPLES = 1000
LEVEL = 0.95
ROW_COLUMNS = ["idx", "label", "split"]


def _dev_rows(runs: Sequence, split: str) -> list[pd.DataFrame] | None:
    """Each run's rows of ``split`` (idx, label, prediction) in idx order; ``runs``: (eval predictions
    file, its column of this run's predictions) per run. None when a run kept none (None or NaN, a
    record older than its predictions file) or kept them without their rows' ids and labels or
    without that column (an ensemble's, before they were kept)."""
    if not runs or any(not isinstance(run, tuple) or not Path(run[0]).is_file() for run in runs):
        return None
    frames = []
    for path, column in runs:
        if not {*ROW_COLUMNS, column} <= set(pq.read_schema(path).names):
            return None
        rows = pd.read_parquet(path, columns=[*ROW_COLUMNS, column]).rename(columns={column: "prediction"})
        frames.append(rows[rows["split"] == split].sort_values("idx", kind="stable").reset_index(drop=True))
    return frames


def paired_interval(task, a: Sequence, b: Sequence | None) -> tuple[float, float, int] | None:
    """The ``LEVEL`` percentile interval of (method ``a``'s score - method ``b``'s) over ``RESAMPLES``
    bootstrap draws of the reported split's rows, in the metric's units, and the rows drawn from;
    ``b`` None: of ``a``'s score alone. ``a``, ``b``: each run's (eval predictions file, column).
    None where it cannot be computed: a run without predictions, a metric scored over windows or
    spans (an answerability task scores a question from its windows: its rows are windows, not what
    the metric counts), or runs not on the same rows."""
    metric = get_metric(task.kind, task.primary_metric)
    if task.answerability or metric.compute is None or metric.aggregation is not None:
        return None
    split = task.eval_splits[0]
    runs_a, runs_b = _dev_rows(a, split), ([] if b is None else _dev_rows(b, split))
    if runs_a is None or runs_b is None:
        return None
    idx = runs_a[0]["idx"].to_numpy()
    if len(idx) == 0 or any(not np.array_equal(r["idx"].to_numpy(), idx) for r in runs_a + runs_b):
        return None
    gold = runs_a[0]["label"].to_numpy()
    preds_a = [r["prediction"].to_numpy() for r in runs_a]
    preds_b = [r["prediction"].to_numpy() for r in runs_b]
    rng = np.random.default_rng(0)
    diffs = np.empty(RESAMPLES)
    for i in range(RESAMPLES):
        rows = rng.integers(0, len(idx), len(idx))
        g = gold[rows]
        other = np.mean([metric.compute(p[rows], g) for p in preds_b]) if preds_b else 0.0
        diffs[i] = np.mean([metric.compute(p[rows], g) for p in preds_a]) - other
    low, high = np.quantile(diffs, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high), len(idx)
