"""What every plot shares: matplotlib without a display, a grid of task panels, log axes with
labelled ticks, a panel's labels, an empty figure's message, and saving a figure as PNG."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

PANELS_PER_ROW = 3  # a grid, not one long row: six tasks in one 2,700 px row were unreadable


def panels(n: int, width: float):
    """``n`` axes (at least one) in rows of at most ``PANELS_PER_ROW``; the grid's unused cells hidden."""
    n = max(1, n)
    cols = min(n, PANELS_PER_ROW)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 4 * rows), squeeze=False)
    cells = list(axes.flat)
    for ax in cells[n:]:
        ax.set_visible(False)
    return fig, cells[:n]


def log_axis(axis, values) -> None:
    """A log axis with labelled ticks however narrow its range (matplotlib labels none inside a
    decade): 1-2-5 steps per decade, 1-2-3-5 when the values span less than one, every integer
    multiple when they span less than a factor of 3; over more than three decades, the decades
    alone, as powers of ten (1-2-5 labels in each ran into one another)."""
    finite = [v for v in values if np.isfinite(v) and v > 0]
    span = max(finite) / min(finite) if finite else 10.0
    if span > 1e3:
        axis.set_major_locator(matplotlib.ticker.LogLocator(base=10))
        axis.set_major_formatter(matplotlib.ticker.LogFormatterMathtext(base=10))
        return
    subs = tuple(range(1, 10)) if span < 3 else (1.0, 2.0, 3.0, 5.0) if span < 10 else (1.0, 2.0, 5.0)
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def say_empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.set_axis_off()


def label_panel(ax, table: pd.DataFrame, task: str, backbone: str, xlabel: str, ylabel: str, legend_size: int):
    """A task's panel: its axes' labels, the task as its title (with the backbone when the table
    holds several), a light grid and the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(task if table["backbone"].nunique() == 1 else f"{task} ({backbone})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
