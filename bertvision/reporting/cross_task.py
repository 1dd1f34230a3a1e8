"""Cross-task transfer: for each task, the heads trained on every shared encoder's states (the
frozen encoder, the task's own fine-tuned encoder, every other task's, every mixture's), and
the heads of tasks with the same label space applied as they are. Per (task, encoder) the
head is picked on the selection split (``reporting.ranking``: best mean over seeds; ties go to
fewer parameters, then the name); its dev score is reported and set against the task's own encoder and the
frozen one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.files import read_json
from bertvision.layout import SharedEncoder, head_metrics_files
from bertvision.registry.tasks import get_task
from bertvision.reporting.markdown import fmt, markdown_table
from bertvision.reporting.ranking import ranked_frame
from bertvision.reporting.results import raced_out

OWN, FROZEN, OTHER, MIXTURE, AS_IS = "own encoder", "frozen", "other task's encoder", "mixture", "source head as is"
COLUMNS = [
    "backbone",
    "task",
    "encoder",
    "role",
    "trained_on",
    "head",
    "metric",
    "dev_mean",
    "dev_std",
    "n",
    "selection_mean",
    "parameters",
    "diff_vs_own",
    "diff_vs_frozen",
]


def role(encoder: SharedEncoder, task: str) -> str:
    if encoder.kind == "frozen":
        return FROZEN
    if encoder.kind == "mixture":
        return MIXTURE
    return OWN if encoder.source == task else OTHER


def trained_on(encoder: SharedEncoder, epochs: dict[str, float]) -> str:
    """What the encoder's weights saw, in words."""
    if encoder.kind == "frozen":
        return "pretrained, untouched"
    if encoder.kind == "task":
        return f"{encoder.source}, {encoder.checkpoint} epoch(s)"
    return f"{' + '.join(encoder.tasks)}, {epochs.get(encoder.name, float('nan')):g} epoch(s)"


def _points(task: str) -> float:
    """Factor that turns a difference of the task's primary metric into points (0-100)."""
    return 100.0 / get_task(task).metric_scale()


def head_runs_on_encoders(
    encoders: list[SharedEncoder],
    models: list[str],
    ft_seeds: list[int],
    heads: dict[str, list[str]],
    epochs: dict[str, float],
) -> pd.DataFrame:
    """One row per trained head run on a shared encoder's states (``heads``: task -> the head
    names the shared mode trains for it); a heads directory that several fine-tuning seeds share
    (the untouched encoder's, held under the first seed) is read once."""
    rows = []
    for model in models:
        for enc in encoders:
            for task_name, names in heads.items():
                task = get_task(task_name)
                dirs = dict.fromkeys(Path(enc.heads_dir(model, seed, task_name)) for seed in ft_seeds)
                for path in head_metrics_files(list(dirs)):
                    r = read_json(path)
                    if r["head"] not in names:
                        continue
                    rows.append(
                        {
                            "backbone": model,
                            "task": task_name,
                            "encoder": enc.name,
                            "role": role(enc, task_name),
                            "trained_on": trained_on(enc, epochs),
                            "head": r["head"],
                            "selection": task.primary_score(r["metrics"], "selection"),
                            "dev": task.headline(r["metrics"]),
                            "parameters": r["parameters"],
                            "raced_out": raced_out(r),
                        }
                    )
    return pd.DataFrame(rows)


def heads_applied_as_is(transfer_files: list[Path]) -> pd.DataFrame:
    """One row per source head run scored on a target task; its selection score is the one it
    had on its own task's selection split (nothing of the target is used to choose)."""
    rows = []
    for path in transfer_files:
        for r in read_json(path)["records"]:
            task = get_task(r["task"])
            rows.append(
                {
                    "backbone": r["backbone"],
                    "task": r["task"],
                    "encoder": r["source_task"],
                    "role": AS_IS,
                    "trained_on": f"{r['source_task']} head on {r['source_task']}'s encoder",
                    "head": r["head"],
                    "selection": r["source_selection"],
                    "dev": task.headline(r["metrics"]),
                    "parameters": r["parameters"],
                    "raced_out": False,  # head_transfer applies no head its race stopped
                }
            )
    return pd.DataFrame(rows)


def cross_task_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (backbone, task, encoder, role): the head picked on selection, with its dev mean ±
    std over seeds and the differences (points) against the task's own and frozen encoders."""
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    keys = ["backbone", "task", "encoder", "role", "trained_on"]
    per_head = (
        runs.groupby([*keys, "head"], sort=False)
        .agg(
            dev_mean=("dev", "mean"),
            dev_std=("dev", lambda v: v.std(ddof=1) if len(v) > 1 else np.nan),
            n=("dev", "size"),
            selection_mean=("selection", "mean"),
            parameters=("parameters", "first"),
            raced_out=("raced_out", lambda v: bool(v.isin([True]).any())),
        )
        .reset_index()
    )
    ranked = ranked_frame(per_head, "head", "selection_mean", "parameters")
    picked = ranked.groupby(keys, sort=False).head(1).copy()
    picked["metric"] = [get_task(t).primary_metric for t in picked["task"]]
    for ref, column in ((OWN, "diff_vs_own"), (FROZEN, "diff_vs_frozen")):
        base = picked[picked["role"] == ref].set_index(["backbone", "task"])["dev_mean"]
        reference = [base.get((b, t), np.nan) for b, t in zip(picked["backbone"], picked["task"])]
        picked[column] = (picked["dev_mean"] - reference) * [_points(t) for t in picked["task"]]
    order = {r: i for i, r in enumerate((OWN, FROZEN, OTHER, MIXTURE, AS_IS))}
    picked["_order"] = picked["role"].map(order)
    picked = picked.sort_values(["backbone", "task", "_order", "encoder"], kind="stable")
    return picked[COLUMNS].reset_index(drop=True)


def _diff(value: float) -> str:
    return "" if np.isnan(value) else f" ({value:+.1f})"


def cross_task_markdown(table: pd.DataFrame) -> str:
    parts = [
        "# Cross-task transfer\n",
        "Rows: the task scored (dev, mean ± std over fine-tuning × head seeds). Columns: the encoder whose "
        "states the task's heads were trained on; the head is picked per cell on the selection split among "
        "`shared.heads` (the summary's frozen-encoder row picks among every head, so it may name another). "
        "In brackets, where the task's own encoder is a column (in bold): points against it. `frozen` is the "
        "pretrained encoder; a mixture was fine-tuned on several tasks at once.\n",
    ]
    if table.empty:
        return "\n".join(parts + ["No head of `shared.heads` finished its training on a shared encoder.\n"])
    for backbone, block in table.groupby("backbone", sort=True):
        trained = block[block["role"] != AS_IS]
        encoders = list(
            dict.fromkeys(
                trained.sort_values(
                    "role", key=lambda r: r.map({FROZEN: 0, OWN: 1, OTHER: 1, MIXTURE: 2}), kind="stable"
                )["encoder"]
            )
        )
        tasks = list(dict.fromkeys(block["task"]))
        rows = []
        for task in tasks:
            cells = trained[trained["task"] == task].set_index("encoder")
            scale = get_task(task).metric_scale()
            row = [task, get_task(task).primary_metric]
            for enc in encoders:
                if enc not in cells.index:
                    row.append("")
                    continue
                c = cells.loc[enc]
                mark = "**" if c["role"] == OWN else ""
                diff = "" if c["role"] == OWN else _diff(c["diff_vs_own"])
                row.append(f"{mark}{fmt(c['dev_mean'], c['dev_std'], scale)}{mark}{diff}")
            rows.append(row)
        parts += [f"## {backbone}\n", markdown_table(["task", "metric", *encoders], rows), ""]
        picks = [
            [r.task, r.encoder, r.role, r.trained_on, r.head, f"{r.parameters:,}", f"{r.selection_mean:.3f}"]
            for r in trained.itertuples()
        ]
        parts += [
            "Heads picked (on selection):\n",
            markdown_table(["task", "encoder", "role", "encoder trained on", "head", "params", "selection"], picks),
            "",
        ]
        as_is = block[block["role"] == AS_IS]
        if len(as_is):
            rows = [
                [
                    r.task,
                    r.encoder,
                    r.head,
                    fmt(r.dev_mean, r.dev_std, get_task(r.task).metric_scale()),
                    str(int(r.n)),
                    f"{r.diff_vs_own:+.1f}",
                    f"{r.diff_vs_frozen:+.1f}",
                ]
                for r in as_is.itertuples()
            ]
            parts += [
                "Heads of a task with the same labels, applied as they are (trained on the source task, "
                "picked on its selection split; the target's states of the source's encoder):\n",
                markdown_table(
                    ["task", "source task", "head", "dev", "n", "vs own (points)", "vs frozen (points)"], rows
                ),
                "",
            ]
    return "\n".join(parts)


def cross_task_heatmap(table: pd.DataFrame, out: Path) -> None:
    """Tasks x encoders: points against each task's own encoder, each cell labelled with its score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = table[table["role"] != AS_IS]
    backbones = sorted(trained["backbone"].unique()) or ["(none)"]
    fig, axes = plt.subplots(
        1,
        len(backbones),
        figsize=(
            2.5 + 1.3 * max(1, trained["encoder"].nunique()) * len(backbones),
            1.5 + 0.6 * max(1, trained["task"].nunique()),
        ),
        squeeze=False,
    )
    for ax, backbone in zip(axes[0], backbones):
        block = trained[trained["backbone"] == backbone]
        if block.empty:
            ax.text(0.5, 0.5, "no shared encoders", ha="center", va="center")
            ax.axis("off")
            continue
        tasks = list(dict.fromkeys(block["task"]))
        encoders = list(
            dict.fromkeys(
                block.sort_values(
                    "role", key=lambda r: r.map({FROZEN: 0, OWN: 1, OTHER: 1, MIXTURE: 2}), kind="stable"
                )["encoder"]
            )
        )
        grid = np.full((len(tasks), len(encoders)), np.nan)
        labels = [["" for _ in encoders] for _ in tasks]
        for r in block.itertuples():
            i, j = tasks.index(r.task), encoders.index(r.encoder)
            grid[i, j] = r.diff_vs_own
            # without the task's own encoder among them (shared.checkpoint: null), the score alone
            labels[i][j] = f"{r.dev_mean:.3g}" + (f"\n{r.diff_vs_own:+.1f}" if np.isfinite(r.diff_vs_own) else "")
        limit = max(1.0, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0)
        image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        for i in range(len(tasks)):
            for j in range(len(encoders)):
                dark = np.isfinite(grid[i, j]) and abs(grid[i, j]) > 0.6 * limit
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(encoders)), encoders, rotation=30, ha="right")
        ax.set_yticks(range(len(tasks)), tasks)
        ax.set_xlabel("encoder the heads were trained on")
        compared = "points vs own encoder" if np.isfinite(grid).any() else "no task's own encoder to compare"
        ax.set_title(f"{backbone}: dev score\n({compared})", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(out, dpi=120, format="png")
    plt.close(fig)
