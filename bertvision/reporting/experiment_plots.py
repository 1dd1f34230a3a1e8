"""The experiments' plots, each from its table: score against the share of training data the
heads used (``experiments.data_fraction``) and BERT's own fine-tuning curve
(``experiments.bert_curve``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from bertvision.reporting.figures import label_panel, panels, save, say_empty
from bertvision.reporting.results import BERT


def data_fraction_curves(table_csv: Path, out: Path) -> None:
    """Score vs share of training data, one panel per (task, checkpoint); BERT (all the data,
    same checkpoint) as a dashed line."""
    table = pd.read_csv(table_csv) if Path(table_csv).stat().st_size else pd.DataFrame()
    shown = sorted(
        {(b, t, c) for b, t, c in zip(table.get("backbone", []), table.get("task", []), table.get("checkpoint", []))}
    )
    fig, axes = panels(len(shown), 4.5)
    for ax, (backbone, task, checkpoint) in zip(axes, shown):
        block = table[(table["backbone"] == backbone) & (table["task"] == task) & (table["checkpoint"] == checkpoint)]
        for model, g in block.groupby("model", sort=False):
            if model == BERT:
                ax.axhline(g["mean"].iloc[0], color="black", linestyle="--", label="BERT (all data)")
                continue
            g = g.sort_values("train_fraction")
            ax.errorbar(
                100 * g["train_fraction"], g["mean"], yerr=g["std"].fillna(0), marker="o", capsize=3, label=model
            )
        ax.set_xlabel("training data used by the head (%)")
        ax.set_ylabel(f"{block['metric'].iloc[0]} (dev)")
        ax.set_title(
            f"{task}, features at {checkpoint:g} epochs" + ("" if len({p[0] for p in shown}) == 1 else f" ({backbone})")
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if not shown:
        say_empty(axes[0], "no data-fraction experiment configured")
    save(fig, out)


def _first_epoch_stretched(ax, points: list[float]) -> bool:
    """An epochs axis from 0 to the last point where the first epoch takes half the width (when
    points lie both inside it and beyond it: returns whether it does), so that its tenths stand
    apart from the whole epochs after it; ticks at every point, labelled at every other one
    inside the first epoch when it holds many."""
    last = max(points)
    stretched = last > 1 and min(points) < 1
    if stretched:
        stretch = last - 1

        def forward(x):
            x = np.asarray(x, dtype=float)
            return np.where(x <= 1, x * stretch, stretch + x - 1)

        def inverse(y):
            y = np.asarray(y, dtype=float)
            return np.where(y <= stretch, y / stretch, y - stretch + 1)

        ax.set_xscale("function", functions=(forward, inverse))
        ax.axvline(1, color="gray", linewidth=0.8, linestyle=":")
    inside = [p for p in points if p < 1]
    labelled = [0.0, *(inside[1::2] if len(inside) > 5 else inside), *(p for p in points if p >= 1)]
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(labelled))
    ax.xaxis.set_minor_locator(matplotlib.ticker.FixedLocator(points))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(0, last)
    return stretched


def bert_curve_plot(table_csv: Path, out: Path) -> None:
    """BERT's fine-tuning curve: per backbone and task, the primary metric on dev and on the
    selection split against the epochs trained (± std over seeds)."""
    table = pd.read_csv(table_csv) if Path(table_csv).stat().st_size else pd.DataFrame()
    blocks = list(table.groupby(["backbone", "task"], sort=True)) if len(table) else []
    fig, axes = panels(len(blocks), 5.0)
    for ax, ((backbone, task), block) in zip(axes, blocks):
        for split, g in block.groupby("split", sort=False):
            g = g.sort_values("epochs")
            ax.errorbar(
                g["epochs"],
                g["mean"],
                yerr=g["std"].fillna(0),
                marker="o",
                markersize=4,
                capsize=2,
                linestyle="--" if split == "selection" else "-",
                label=split,
            )
        stretched = _first_epoch_stretched(ax, sorted(block["epochs"].unique()))
        xlabel = "epochs of fine-tuning" + (" (the first is half the axis)" if stretched else "")
        label_panel(ax, table, task, backbone, xlabel, block["metric"].iloc[0], 8)
    if not blocks:
        say_empty(axes[0], "no BERT fine-tuning curve configured\n(experiments.bert_curve.tasks)")
    save(fig, out)
