"""The run's plots from the result tables and head metrics (matplotlib, PNG), readable without the
text: score vs epoch fraction, score vs trainable parameters and seconds, every method on cost and
score, where in the encoder each task's information lives (the learned ScalarMix layer weights)
and the heads' training-loss curves. The experiments' plots: ``reporting.experiment_plots``."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bertvision.files import read_json  # noqa: E402
from bertvision.layout import head_metrics_files, plot, score_vs_epochs_plot, source_checkpoint  # noqa: E402
from bertvision.registry.tasks import get_task  # noqa: E402
from bertvision.reporting.figures import label_panel, log_axis, panels, save, say_empty  # noqa: E402
from bertvision.reporting.methods import on_front as on_front_of  # noqa: E402
from bertvision.reporting.results import BERT, raced_out, repeats_frozen_run  # noqa: E402
from bertvision.reporting.summary import FULL_FT, PEER, ROW_KINDS  # noqa: E402


def primary_rows(summary: pd.DataFrame, task: str) -> pd.DataFrame:
    """The task's primary metric on its first evaluation split, without ensemble rows, nor rows
    holding a run the race stopped early (its score cut short: a head that falls with fine-tuning)."""
    spec = get_task(task)
    finished = summary["stopped"].eq(0) if "stopped" in summary else True
    rows = summary[
        (summary["task"] == task)
        & (summary["metric"] == spec.primary_metric)
        & (summary["split"] == spec.eval_splits[0])
        & ~summary["ensemble"].astype(bool)
        & finished
    ].copy()
    several = rows["backbone"].nunique() > 1
    rows["label"] = [f"{b}: {m}" if several else m for b, m in zip(rows["backbone"], rows["model"])]
    return rows


def score_vs_epochs(summary: pd.DataFrame, task: str, path: Path) -> None:
    rows = primary_rows(summary, task)
    fig, ax = plt.subplots(figsize=(6, 4))
    for (label, model), g in rows.groupby(["label", "model"], sort=False):
        g = g.sort_values("checkpoint")
        style = {"color": "black", "linewidth": 2.5, "marker": "s"} if model == BERT else {"marker": "o"}
        ax.errorbar(g["checkpoint"], g["mean"], yerr=g["std"].fillna(0), capsize=3, label=label, **style)
    spec = get_task(task)
    ax.set_xlabel("fine-tuning epochs before freezing")
    ax.set_ylabel(f"{spec.primary_metric} ({spec.eval_splits[0]})")
    ax.set_title(f"{task}: BERT vs heads on its frozen hidden states")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def score_vs_params(summary: pd.DataFrame, tasks: list[str], path: Path) -> None:
    fig, axes = panels(len(tasks), 4.5)
    for ax, task in zip(axes, tasks):
        rows = primary_rows(summary, task)
        last = rows[rows["checkpoint"] == rows["checkpoint"].max()]
        for _, r in last.iterrows():
            ax.errorbar(
                r["parameter_percent"],
                r["mean"],
                yerr=0 if np.isnan(r["std"]) else r["std"],
                marker="s" if r["model"] == BERT else "o",
                capsize=3,
                color="black" if r["model"] == BERT else None,
            )
            ax.annotate(
                r["label"], (r["parameter_percent"], r["mean"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        ax.set_xscale("log")
        log_axis(ax.xaxis, last["parameter_percent"])
        ax.set_xlabel("trainable parameters (% of the encoder)")
        ax.set_ylabel(get_task(task).primary_metric)
        ax.set_title(f"{task} at {last['checkpoint'].max():g} epochs")
        ax.grid(alpha=0.3)
    save(fig, path)


def layer_weight_rows(head_metrics: list[Path]) -> tuple[list[np.ndarray], list[str]]:
    """Per task, the mean softmax(w) of the LP head (``lp``) at the last checkpoint where its runs finished,
    and the row's label; a task whose every run the race stopped keeps its row from those runs,
    marked (not dropped)."""
    rows = [
        {"task": r["task"], "checkpoint": source_checkpoint(r).fraction, "weights": r["layer_weights"],
         "stopped": raced_out(r)}
        for r in map(read_json, head_metrics)
        if r["head"] == "lp" and "layer_weights" in r
    ]  # fmt: skip
    matrix, labels = [], []
    for task, g in pd.DataFrame(rows, columns=["task", "checkpoint", "weights", "stopped"]).groupby("task"):
        g = g[~g["stopped"]] if (~g["stopped"]).any() else g
        g = g[g["checkpoint"] == g["checkpoint"].max()]
        matrix.append(np.mean(np.stack(g["weights"].to_numpy()), axis=0))
        labels.append(f"{task} ({g['checkpoint'].iloc[0]:g} ep{', stopped early' if g['stopped'].all() else ''})")
    return matrix, labels


def layer_weights(head_metrics: list[Path], path: Path) -> None:
    """The LP head's learned layer weights per task (``layer_weight_rows``)."""
    matrix, labels = layer_weight_rows(head_metrics)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * max(1, len(labels))))
    if matrix:
        image = ax.imshow(np.array(matrix), aspect="auto", cmap="viridis")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xticks(range(len(matrix[0])), ["emb", *[str(i) for i in range(1, len(matrix[0]))]])
        fig.colorbar(image, ax=ax, label="ScalarMix weight")
    ax.set_xlabel("layer (emb = embedding output)")
    ax.set_title("Learned layer weights of the LP head, per task")
    save(fig, path)


def training_loss_frame(head_metrics: list[Path], baseline_metrics: list[Path] = ()) -> pd.DataFrame:
    """The curves of the training-loss plot: one row per (backbone, task, model, checkpoint,
    epoch) with the training loss's mean, sample std and count over the runs (fine-tuning seeds
    x head seeds) whose history reaches that epoch. A head's loss is its epoch's mean training
    loss (``history[].train_loss``); copies of the untouched encoder's runs (``repeats_frozen_run``)
    count once. Full fine-tuning (``model`` FULL_FT, checkpoint NaN) is the baseline's loss over its
    last steps at each epoch's end (``history[].train_loss_recent``)."""
    rows, frozen_seen = [], set()
    records = sorted((read_json(p) for p in head_metrics), key=lambda r: int(r["source"].get("ft_seed", 0)))
    for r in records:
        if repeats_frozen_run(r, frozen_seen):
            continue
        run = {"backbone": r["source"]["model"], "task": r["task"], "model": r["head"]}
        run["checkpoint"] = source_checkpoint(r).fraction
        rows += [{**run, "epoch": h["epoch"], "loss": h["train_loss"]} for h in r.get("history") or []]
    for path in baseline_metrics:
        r = read_json(path)
        run = {"backbone": r["model"], "task": r["task"], "model": FULL_FT, "checkpoint": np.nan}
        rows += [
            {**run, "epoch": h["epoch"], "loss": h["train_loss_recent"]}
            for h in r.get("history") or []
            if h.get("train_loss_recent") is not None
        ]
    keys = ["backbone", "task", "model", "checkpoint", "epoch"]
    if not rows:
        return pd.DataFrame(columns=[*keys, "train_loss", "std", "n"])
    grouped = pd.DataFrame(rows).groupby(keys, sort=False, dropna=False)["loss"]
    frame = grouped.agg(train_loss="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan, n="count")
    return frame.reset_index().sort_values(keys, kind="stable", ignore_index=True)


CHECKPOINT_LINES = ("solid", "dashed", "dotted", "dashdot")  # the last checkpoint first


def training_loss(
    head_metrics: list[Path], path: Path, baseline_metrics: list[Path] = (), tasks: list[str] | None = None
) -> pd.DataFrame:
    """Per task: the heads' training loss against their epoch (mean over seeds), a colour per
    head and a line style per checkpoint (solid: the last), and full fine-tuning's in black.
    Returns the frame it plots (``training_loss_frame``)."""
    frame = training_loss_frame(head_metrics, baseline_metrics)
    order = {t: i for i, t in enumerate(tasks or [])}
    blocks = sorted(
        frame.groupby(["backbone", "task"], sort=False), key=lambda b: (order.get(b[0][1], len(order)), b[0])
    )
    heads = list(dict.fromkeys(m for m in frame["model"] if m != FULL_FT))
    colours = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(heads)}
    checkpoints = sorted(set(frame["checkpoint"].dropna()), reverse=True)
    lines = {c: CHECKPOINT_LINES[min(i, len(CHECKPOINT_LINES) - 1)] for i, c in enumerate(checkpoints)}
    fig, axes = panels(len(blocks), 4.5)
    for ax, ((backbone, task), block) in zip(axes, blocks):
        for (model, checkpoint), g in block.groupby(["model", "checkpoint"], sort=False, dropna=False):
            if model == FULL_FT:
                style = {"color": "black", "linewidth": 2, "marker": "s", "markersize": 4}
            else:
                style = {"color": colours[model], "linestyle": lines[checkpoint], "linewidth": 1.2, "marker": "o"}
                style["markersize"] = 2.5
            ax.plot(g["epoch"], g["train_loss"], **style)
        shown_heads = [h for h in heads if h in set(block["model"])]
        shown_checkpoints = [c for c in checkpoints if c in set(block["checkpoint"].dropna())]
        handles = [matplotlib.lines.Line2D([], [], color=colours[h], label=h) for h in shown_heads]
        handles += [
            matplotlib.lines.Line2D([], [], color="gray", linestyle=lines[c], label=f"features at {c:g} ep")
            for c in shown_checkpoints
        ]
        if FULL_FT in set(block["model"]):
            handles.append(matplotlib.lines.Line2D([], [], color="black", linewidth=2, marker="s", label=FULL_FT))
        losses = block["train_loss"]
        if losses.min() > 0 and losses.max() / losses.min() > 10:  # a loss that falls by decades
            ax.set_yscale("log")
            log_axis(ax.yaxis, losses)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("epoch (head; full FT: fine-tuning)")
        ax.set_ylabel("training loss (mean over seeds)")
        ax.set_title(task if frame["backbone"].nunique() == 1 else f"{task} ({backbone})")
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=6, ncol=2 if len(handles) > 6 else 1)
    if not blocks:
        say_empty(axes[0], "no training histories yet")
    save(fig, path)
    return frame


def build_plots(
    result_csvs: list[Path],
    tasks: list[str],
    out_dir: Path,
    head_dirs: list[Path] = (),
    summary_csv: Path | None = None,
    baseline_metrics: list[Path] = (),
    methods_csv: Path | None = None,
) -> None:
    summary = pd.concat([pd.read_csv(p) for p in result_csvs if Path(p).stat().st_size], ignore_index=True)
    if summary_csv is not None:
        score_vs_seconds(summary_csv, Path(plot("score-vs-seconds", out_dir)))
    if methods_csv is not None:
        methods_cost_score(methods_csv, Path(plot("methods-cost-score", out_dir)))
    for task in tasks:
        score_vs_epochs(summary, task, Path(plot(score_vs_epochs_plot(task), out_dir)))
    score_vs_params(summary, tasks, Path(plot("score-vs-parameters", out_dir)))
    head_metrics = head_metrics_files(head_dirs)
    layer_weights(head_metrics, Path(plot("layer-weights", out_dir)))
    training_loss(head_metrics, Path(plot("training-loss", out_dir)), baseline_metrics, tasks)


ROW_STYLES = dict(
    zip(
        ROW_KINDS,
        (  # summary row kind -> marker style
            {"marker": "*", "s": 220, "color": "black", "zorder": 3},
            {"marker": "s", "s": 60, "color": "tab:gray"},
            {"marker": "o", "s": 90, "color": "tab:red", "zorder": 3},
            {"marker": "o", "s": 60, "color": "tab:orange"},
            {"marker": "D", "s": 60, "color": "tab:blue"},
            {"marker": "^", "s": 90, "color": "tab:green", "zorder": 3},
        ),
    )
)


def score_vs_seconds(summary_csv: Path, path: Path) -> None:
    """Per task: each summary row's dev score against the seconds it took (± std over seeds
    both ways), full fine-tuning marked (a star, with its ± std band)."""
    table = pd.read_csv(summary_csv) if Path(summary_csv).stat().st_size else pd.DataFrame()
    blocks = list(table.groupby(["backbone", "task"], sort=False)) if len(table) else []
    fig, axes = panels(len(blocks), 4.2)
    for ax, ((backbone, task), block) in zip(axes, blocks):
        for r in block.itertuples():
            ax.scatter(
                r.seconds,
                r.dev_mean,
                label=r.row if r.row not in ax.get_legend_handles_labels()[1] else None,
                **ROW_STYLES.get(r.row, {}),
            )
            ax.errorbar(
                r.seconds,
                r.dev_mean,
                yerr=0 if np.isnan(r.dev_std) else r.dev_std,
                xerr=0 if np.isnan(getattr(r, "seconds_std", np.nan)) else r.seconds_std,
                color="gray",
                capsize=2,
                linewidth=0.8,
            )
            ax.annotate(
                "full FT" if r.row == FULL_FT else r.model if r.row == PEER else f"{r.model} @{r.checkpoint:g}",
                (r.seconds, r.dev_mean),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
            if r.row == FULL_FT and not np.isnan(r.dev_std):
                ax.axhspan(r.dev_mean - r.dev_std, r.dev_mean + r.dev_std, color="black", alpha=0.08)
        ax.set_xscale("log")
        log_axis(ax.xaxis, block["seconds"])
        label_panel(ax, table, task, backbone, "own seconds (log; the verdict weighs whole seconds)",
                    f"{block['metric'].iloc[0]} (dev)", 6)  # fmt: skip
    if not blocks:
        say_empty(axes[0], "no results yet")
    save(fig, path)


# method family (reporting/methods.py) -> marker style
FAMILY_STYLES = {
    "full fine-tuning": {"marker": "*", "s": 200, "color": "black", "zorder": 4},
    "peer": {"marker": "^", "s": 80, "color": "tab:green", "zorder": 4},
    "BERT at a checkpoint": {"marker": "s", "s": 45, "color": "tab:gray", "zorder": 3},
    "BERTVision": {"marker": "o", "s": 25, "color": "tab:red", "alpha": 0.6, "zorder": 2},
}


def _front_line(ax, x: pd.Series, y: pd.Series) -> None:
    """The cost-score front as a step line through the points no other beats on both."""
    order = np.argsort(x.to_numpy())
    xs, ys = x.to_numpy()[order], y.to_numpy()[order]
    ax.step(xs, ys, where="post", color="tab:purple", linewidth=1, alpha=0.7, label="front")


def methods_cost_score(methods_csv: Path, path: Path) -> None:
    """Per task, two panels: every method's dev score (mean ± std over seeds) against its seconds
    (log) and against its trainable parameters (log), full fine-tuning, the peers, BERT and every
    BERTVision candidate, each front drawn (``reporting.methods``); the peers and full fine-tuning
    named."""
    table = pd.read_csv(methods_csv) if Path(methods_csv).stat().st_size else pd.DataFrame()
    blocks = list(table.groupby(["backbone", "task"], sort=False)) if len(table) else []
    rows = max(1, len(blocks))
    fig, axes = plt.subplots(rows, 2, figsize=(11, 4 * rows), squeeze=False)
    for (ax_s, ax_p), ((backbone, task), block) in zip(axes, blocks):
        params = block["trainable_params"].clip(lower=1)  # the cosine trains nothing: drawn at 1
        for ax, x in ((ax_s, block["cost_seconds"]), (ax_p, params)):
            for family, style in FAMILY_STYLES.items():
                rows_of = block["family"] == family
                if rows_of.any():
                    ax.scatter(x[rows_of], block["dev_mean"][rows_of], label=family, **style)
            ax.errorbar(x, block["dev_mean"], yerr=block["dev_std"].fillna(0), fmt="none", ecolor="gray",
                        elinewidth=0.7, capsize=2)  # fmt: skip
            named = block["family"].isin(["full fine-tuning", "peer"])
            for xv, yv, name in zip(x[named], block["dev_mean"][named], block["model"][named]):
                ax.annotate("full FT" if name.startswith("BERT, epoch kept") else name, (xv, yv), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")  # fmt: skip
            finished = block["stopped"] == 0  # as methods.csv's front: runs the race stopped left off
            front = on_front_of(x.where(finished), block["dev_mean"].where(finished))
            _front_line(ax, x[front], block["dev_mean"][front])
            ax.set_xscale("log")
        log_axis(ax_s.xaxis, block["cost_seconds"])  # seconds span a decade or two; parameters 10^0 to 10^8
        title = task if table["backbone"].nunique() == 1 else f"{task} ({backbone})"
        metric = f"{block['metric'].iloc[0]} (dev)"
        label_panel(ax_s, table, title, backbone, "seconds (log)", metric, 6)
        label_panel(ax_p, table, title, backbone, "trainable parameters (log)", metric, 6)
    if not blocks:
        say_empty(axes[0][0], "no results yet")
        axes[0][1].set_visible(False)
    save(fig, path)
