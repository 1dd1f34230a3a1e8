"""The plots people read: panels in a grid of at most three per row, and log axes whose ticks
carry labels even where the values span less than a decade."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402

from bertvision.reporting import plots  # noqa: E402
from bertvision.reporting.summary import FULL_FT, ROW_KINDS  # noqa: E402


def summary_csv(path, tasks, seconds):
    rows = []
    for task in tasks:
        for row, second, score in zip((FULL_FT, ROW_KINDS[2], ROW_KINDS[4]), seconds, (0.8, 0.78, 0.7)):
            rows.append({"backbone": "m", "task": task, "row": row, "model": "lp", "metric": "accuracy",
                         "epoch_fraction": np.nan if row == FULL_FT else 1.0, "dev_mean": score, "dev_std": 0.01,
                         "seconds": second, "seconds_std": 1.0})  # fmt: skip
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_six_tasks_make_a_grid_not_one_long_row(tmp_path):
    tasks = ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]
    out = tmp_path / "score-vs-seconds.png"
    plots.score_vs_seconds(summary_csv(tmp_path / "s.csv", tasks, (300.0, 120.0, 40.0)), out)
    width, height = Image.open(out).size
    assert width <= plots.PANELS_PER_ROW * 4.2 * 120 + 10 and height >= 2 * 4 * 120 - 10


def test_a_log_axis_narrower_than_a_decade_has_labelled_ticks():
    fig, ax = plt.subplots()
    values = [31.0, 38.0, 45.0]  # no power of ten inside: matplotlib's default labels nothing here
    ax.scatter(values, [1, 2, 3])
    ax.set_xscale("log")
    plots._log_axis(ax.xaxis, values)
    fig.canvas.draw()
    low, high = ax.get_xlim()
    labelled = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
    assert len(labelled) >= 2, labelled
    plt.close(fig)
