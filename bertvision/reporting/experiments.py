"""Tables of the paper's experiments beyond the main results: the optuna searches, the
data-fraction curves and cross-checkpoint transfer. Every number comes from a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.files import read_json
from bertvision.layout import Checkpoint, source_checkpoint
from bertvision.registry.tasks import get_task
from bertvision.reporting.bert_records import is_scored
from bertvision.reporting.markdown import fmt, markdown_table
from bertvision.reporting.results import BERT


def _primary(task: str, metrics: dict) -> float:
    return get_task(task).headline(metrics)


def _cell(block: pd.DataFrame, key) -> str:
    """The mean ± std of ``block`` (indexed by the column key) at ``key``, or blank."""
    if key not in block.index:
        return ""
    row = block.loc[key]
    return fmt(row["mean"], row["std"], get_task(row["task"]).metric_scale())


def over_seeds(df: pd.DataFrame, keys: list[str], sort: bool = False, **extra) -> pd.DataFrame:
    """Mean, sample std and count of ``value`` per ``keys``, plus the task's primary metric name."""
    out = (
        df.groupby(keys, sort=sort)
        .agg(
            **extra,
            mean=("value", "mean"),
            std=("value", lambda v: v.std(ddof=1) if len(v) > 1 else np.nan),
            n=("value", "count"),
        )
        .reset_index()
    )
    out["metric"] = [get_task(t).primary_metric for t in out["task"]]
    return out


# --- search ----------------------------------------------------------------------------------
def _range(dist: dict) -> str:
    if "choices" in dist:
        return "{" + ", ".join(str(c) for c in dist["choices"]) + "}"
    return f"[{dist['low']:g}, {dist['high']:g}]" + (" log" if dist.get("log") else "")


def search_table(best_files: list[Path]) -> pd.DataFrame:
    rows = []
    for path in best_files:
        r = read_json(path)
        rows.append(
            {
                "backbone": r["keys"]["model"],
                "task": r["keys"]["task"],
                "checkpoint": Checkpoint.named(r["keys"]["checkpoint"]).fraction,
                "head": r["keys"]["head"],
                "ft_seed": int(r["keys"]["ftseed"]),
                "complete": r["trials"]["COMPLETE"],
                "pruned": r["trials"]["PRUNED"],
                "failed": r["trials"]["FAIL"],
                "searched": "; ".join(f"{k} {_range(v)}" for k, v in r["space"].items()),
                "best": "; ".join(
                    f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["best_params"].items()
                ),
                "best_selection_score": r["best_value"],
                "study": r["study"],
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "backbone",
            "task",
            "checkpoint",
            "head",
            "ft_seed",
            "complete",
            "pruned",
            "failed",
            "searched",
            "best",
            "best_selection_score",
            "study",
        ],
    )


def page(title: str, unconfigured: str):
    """Decorator: a table's Markdown page, the lines of ``body(table)`` under ``title``; a page
    that says so when the experiment is not configured (an empty table)."""

    def wrap(body):
        def render(table: pd.DataFrame) -> str:
            if not len(table):
                return f"# {title}\n\nNo {unconfigured}.\n"
            return "\n".join([f"# {title}", "", *body(table)])

        return render

    return wrap


def _seed_cell(values: pd.Series, seeds: pd.Series) -> str:
    """One study's value, or each fine-tuning seed's study's."""
    if len(values) == 1:
        return str(values.iloc[0])
    return " / ".join(f"ft{seed}: {value}" for seed, value in zip(seeds, values))


@page("Hyperparameter search (optuna)", "search configured (tasks.<task>.search_heads)")
def search_markdown(table: pd.DataFrame) -> list[str]:
    parts = [
        "One study per task, fine-tuning seed, checkpoint and head; the objective is the primary metric on "
        "the selection split (dev is never seen). The best trial's parameters train the final heads (marked † "
        "in the result tables, whose scores are mean ± std over every head seed). The best trial's score is "
        "the best of its study's trials, each trained with one head seed: an optimistic number. With several "
        "fine-tuning seeds, each has its own study: their trial counts are summed, their best scores given as "
        "mean ± sample std over the studies (n).",
        "",
    ]
    rows = []
    for (backbone, task, checkpoint, head), g in table.groupby(["backbone", "task", "checkpoint", "head"], sort=False):
        g = g.sort_values("ft_seed")
        scores = g["best_selection_score"]
        std = scores.std(ddof=1) if len(g) > 1 else np.nan
        rows.append(
            [
                backbone,
                task,
                f"{checkpoint:g}",
                head,
                str(len(g)),
                str(int(g["complete"].sum())),
                str(int(g["pruned"].sum())),
                str(int(g["failed"].sum())),
                _seed_cell(g["searched"], g["ft_seed"]) if g["searched"].nunique() > 1 else g["searched"].iloc[0],
                _seed_cell(g["best"], g["ft_seed"]),
                f"{scores.mean():.4f}" if np.isnan(std) else f"{scores.mean():.4f} ± {std:.4f}",
            ]
        )
    parts.append(
        markdown_table(
            [
                "backbone",
                "task",
                "epochs",
                "head",
                "n",
                "complete",
                "pruned",
                "failed",
                "searched",
                "best",
                "best trial's selection score",
            ],
            rows,
        )
    )
    return parts + [""]


# --- data fraction ---------------------------------------------------------------------------
def data_fraction_table(subset_runs: list[Path], full_runs: list[Path], bert_metrics: list[Path]) -> pd.DataFrame:
    """Primary dev metric per (task, checkpoint, model, training fraction); BERT rows (at the
    same checkpoint, always trained on all of the data) carry fraction 1."""
    rows = []
    wanted = set()
    for path in subset_runs:
        m = read_json(path)
        wanted.add((m["source"]["model"], m["task"], source_checkpoint(m), m["head"]))
    for path in [*subset_runs, *full_runs]:
        m = read_json(path)
        key = (m["source"]["model"], m["task"], source_checkpoint(m), m["head"])
        if key in wanted:
            rows.append(
                {
                    "backbone": key[0],
                    "task": key[1],
                    "checkpoint": key[2].fraction,
                    "model": key[3],
                    "train_fraction": m["train_fraction"],
                    "train_examples": m["train_examples"],
                    "value": _primary(m["task"], m["metrics"]),
                }
            )
    checkpoints = {(b, t, c) for b, t, c, _ in wanted}
    for path in bert_metrics:
        m = read_json(path)
        checkpoint = Checkpoint.named(m["checkpoint"])
        if is_scored(m) and (m["model"], m["task"], checkpoint) in checkpoints:
            rows.append(
                {
                    "backbone": m["model"],
                    "task": m["task"],
                    "checkpoint": checkpoint.fraction,
                    "model": BERT,
                    "train_fraction": 1.0,
                    "train_examples": np.nan,
                    "value": _primary(m["task"], m["metrics"]),
                }
            )
    df = pd.DataFrame(
        rows, columns=["backbone", "task", "checkpoint", "model", "train_fraction", "train_examples", "value"]
    )
    return over_seeds(
        df,
        ["backbone", "task", "checkpoint", "model", "train_fraction"],
        sort=True,
        train_examples=("train_examples", "first"),
    )


@page("Data fraction", "data-fraction experiment configured (experiments.data_fraction.tasks)")
def data_fraction_markdown(table: pd.DataFrame) -> list[str]:
    parts = [
        "Heads trained on nested random subsets of the training features (selection and dev whole), "
        "against BERT fine-tuned on all of them to the same checkpoint. Dev, mean ± std over seeds.",
        "",
    ]
    for (backbone, task, checkpoint), block in table.groupby(["backbone", "task", "checkpoint"], sort=True):
        fractions = sorted(block.loc[block["model"] != BERT, "train_fraction"].unique())
        parts += [f"## {task} ({backbone}), {checkpoint:g} epochs ({block['metric'].iloc[0]})", ""]
        rows = []
        for model, g in block.groupby("model", sort=False):
            by = g.set_index("train_fraction")
            cells = [_cell(by, f) for f in fractions]
            if model == BERT:
                cells = [""] * (len(fractions) - 1) + [_cell(by, 1.0)]
            rows.append([model, *cells])
        n_examples = block.loc[block["model"] != BERT].groupby("train_fraction")["train_examples"].first()
        header = [f"{f:g} ({int(n_examples[f])})" for f in fractions]
        parts += [markdown_table(["model", *header], rows), ""]
    parts.append("Columns: share of the training rows (examples, or windows for span tasks).")
    return parts + [""]


# --- transfer --------------------------------------------------------------------------------
def transfer_table(transfer_files: list[Path], bert_metrics: list[Path]) -> pd.DataFrame:
    """Per head, share of train, standardization and (trained on, evaluated on) checkpoint: the
    mean over its runs, each counted once (checkpoint 0's heads on its own states are in every
    fine-tuning seed's file)."""
    rows = []
    for number, path in enumerate(transfer_files):
        for r in read_json(path)["records"]:
            rows.append(
                {
                    "backbone": r["backbone"],
                    "task": r["task"],
                    "model": r["head"],
                    "train_fraction": r["train_fraction"],
                    "standardization": r["standardization"],
                    "trained_on": r["trained_on"],
                    "evaluated_on": r["evaluated_on"],
                    "ft_seed": r["ft_seed"],
                    "seed": r["seed"],
                    # a record written before it was kept: its file's own run, as such records were counted
                    "evaluated_ft_seed": r.get("evaluated_ft_seed", -1 - number),
                    "value": _primary(r["task"], r["metrics"]),
                }
            )
    if rows:
        rows = pd.DataFrame(rows).drop_duplicates(subset=[k for k in rows[0] if k != "value"]).to_dict("records")
    tasks = {(r["backbone"], r["task"]) for r in rows}
    for path in bert_metrics:
        m = read_json(path)
        if is_scored(m) and (m["model"], m["task"]) in tasks:
            checkpoint = m["checkpoint"]
            rows.append(
                {
                    "backbone": m["model"],
                    "task": m["task"],
                    "model": BERT,
                    "train_fraction": 1.0,
                    "standardization": "",
                    "trained_on": checkpoint,
                    "evaluated_on": checkpoint,
                    "value": _primary(m["task"], m["metrics"]),
                }
            )
    keys = ["backbone", "task", "model", "train_fraction", "standardization", "trained_on", "evaluated_on"]
    return over_seeds(pd.DataFrame(rows, columns=[*keys, "value"]), keys)


@page("Cross-checkpoint transfer", "transfer experiment configured (experiments.transfer.tasks)")
def transfer_markdown(table: pd.DataFrame) -> list[str]:
    parts = [
        "Each head trained on the hidden states of one checkpoint (rows), evaluated unchanged on the "
        "states of every checkpoint of the same fine-tuning run (columns); a head the race stopped is "
        "left out. The diagonal, standardized as the head was trained, is the head on its own features "
        "(standardized with the checkpoint's statistics, a data-fraction head reads the whole train "
        "split's, not its share's); `BERT` is the backbone's own head at each checkpoint. `input standardized "
        "with`: the train-split statistics of the checkpoint the head was trained on (the head "
        "unchanged), or of the checkpoint it is evaluated on (no labels needed). `share of train`: "
        "the data-fraction heads (experiments.data_fraction) trained on that share of the checkpoint's "
        "training rows, applied the same way. Dev, mean ± std over seeds.",
        "",
    ]
    for (backbone, task), block in table.groupby(["backbone", "task"], sort=True):
        checkpoints = sorted(block["evaluated_on"].unique(), key=float)
        parts += [f"## {task} ({backbone}; {block['metric'].iloc[0]})", ""]
        keyed = []  # (sort key, row): sorted on the numbers, not on their formatted cells
        groups = block.groupby(["model", "train_fraction", "standardization", "trained_on"], sort=False)
        for (model, fraction, how, source), g in groups:
            by = g.set_index("evaluated_on")
            standardized = {"source": "trained on", "target": "evaluated on"}.get(how, "")
            row = [model, f"{fraction:.0%}", source, standardized, *[_cell(by, c) for c in checkpoints]]
            keyed.append(((standardized != "trained on", model, -fraction, float(source)), row))
        bert = [r for _, r in keyed if r[0] == BERT]
        own_cells = [next((r[4 + i] for r in bert if r[2] == c), "") for i, c in enumerate(checkpoints)]
        bert_row = [BERT, "100%", "(own)", "", *own_cells]
        rows = [r for _, r in sorted(((k, r) for k, r in keyed if r[0] != BERT), key=lambda kr: kr[0])]
        parts += [
            markdown_table(
                [
                    "head",
                    "share of train",
                    "trained on",
                    "input standardized with",
                    *[f"on {c} ep" for c in checkpoints],
                ],
                rows + [bert_row],
            ),
            "",
        ]
    return parts
