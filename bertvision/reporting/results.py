"""The main result tables (GLUE and SQuAD 2.0): every run's dev scores from its metrics file,
with its degenerate-run flag, summarized as mean ± std over seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.evaluation.ensemble import ENSEMBLES, ensemble_rules
from bertvision.evaluation.flags import metric_flag, prediction_flags
from bertvision.files import read_json
from bertvision.layout import BERT_PREDICTIONS, HEAD_PREDICTIONS, Checkpoint, source_checkpoint
from bertvision.registry.heads import BERT_HEAD as BERT
from bertvision.registry.task_spec import TaskSpec
from bertvision.registry.tasks import get_task
from bertvision.reporting.bert_records import is_scored
from bertvision.reporting.markdown import fmt, markdown_table


def ensemble_name(head: str, how: str) -> str:
    return f"{head} + BERT ({how})"


def ensemble_parameters(record: dict) -> int:
    """A head + BERT ensemble's trainable parameters: the head's and the fine-tuned encoder's."""
    return record["parameters"] + record["encoder_parameters"]


# What an answerability record counts besides its metrics (registry.metrics.score).
QUESTION_COUNTS = ("questions", "answerable_no_window")


def _rows(task: TaskSpec, metrics: dict, run_flags: dict, **columns) -> list[dict]:
    """One row per evaluation split and metric of ``task`` (span tasks also score selection,
    which is left out), flagged by the run's predictions or a chance-level score."""
    return [
        {
            "task": task.name,
            "split": split,
            "metric": metric,
            "value": value,
            **columns,
            "flag": run_flags.get(split) or metric_flag(task, metric, value),
            # answerability: the scored questions, and the answerable ones no window wholly holds
            **{key: values.get(key, np.nan) for key in QUESTION_COUNTS},
        }
        for split, values in metrics.items()
        if split in task.eval_splits
        for metric, value in values.items()
        if metric in task.metrics
    ]


def raced_out(record: dict) -> bool:
    """Whether a head record is a run its job's race stopped (``heads.race``): counted in the
    whole cost, never picked, not applied elsewhere."""
    return (record.get("race") or {}).get("raced_out_at_epoch") is not None


def repeats_frozen_run(record: dict, seen: set) -> bool:
    """Whether a head record repeats an earlier one on the untouched encoder: checkpoint 0 is the
    same encoder, with the same states, for every fine-tuning seed, so its head runs with one
    head seed are copies, not new samples: they count once in means, stds and n (records are
    visited fine-tuning seed first). The pipeline runs checkpoint 0 once (``Run.states_owner``);
    copies come from runs made before it did, or from a heads directory given twice."""
    if source_checkpoint(record).fraction != 0:
        return False
    key = (record["source"]["model"], record["task"], record["head"], record["seed"], record.get("train_fraction"))
    if key in seen:
        return True
    seen.add(key)
    return False


def long_records(bert_metrics: list[Path], head_metrics: list[Path]) -> pd.DataFrame:
    """One row per (run, eval split, metric), with the run's degenerate-run flag if any."""
    rows = []
    for path in bert_metrics:
        m = read_json(path)
        if not is_scored(m):
            continue
        task = get_task(m["task"])
        flags = prediction_flags(Path(path).with_name(BERT_PREDICTIONS), task)
        rows += _rows(
            task,
            m["metrics"],
            flags,
            backbone=m["model"],
            checkpoint=Checkpoint.named(m["checkpoint"]).fraction,
            model=BERT,
            seed=m["seed"],
            parameter_percent=100.0,
            tuned=False,
            ensemble=False,
            stopped=False,
        )
    frozen_seen: set[tuple] = set()
    records = sorted(((read_json(p), p) for p in head_metrics), key=lambda mp: int(mp[0]["source"].get("ft_seed", 0)))
    for m, path in records:
        task = get_task(m["task"])
        run = {
            "backbone": m["source"]["model"],
            "checkpoint": source_checkpoint(m).fraction,
            "seed": f"{m['source'].get('ft_seed', '')}/{m['seed']}",
            "tuned": m.get("search") is not None,
        }
        # one seed, cut short by its job's race: shown and flagged (its ensembles too), never picked or plotted
        stopped = f"stopped by the race at epoch {m['race']['raced_out_at_epoch']}" if raced_out(m) else None
        run["stopped"] = stopped is not None
        if not repeats_frozen_run(m, frozen_seen):  # an untouched encoder's head counts once
            flags = prediction_flags(Path(path).with_name(HEAD_PREDICTIONS), task)
            if stopped:
                flags = {split: "; ".join(filter(None, (flags.get(split), stopped))) for split in task.eval_splits}
            rows += _rows(
                task,
                m["metrics"],
                flags,
                model=m["head"],
                parameter_percent=m["parameter_percent"],
                ensemble=False,
                **run,
            )
        for how in ensemble_rules(task):  # the distinct ones: max = mean for two classes
            if how in m.get("ensembles", {}):
                rows += _rows(
                    task,
                    m["ensembles"][how],
                    dict.fromkeys(task.eval_splits, stopped) if stopped else {},
                    model=ensemble_name(m["head"], how),
                    parameter_percent=100.0 + m["parameter_percent"],
                    ensemble=True,
                    **run,
                )
    return pd.DataFrame(rows)


def summarize(records: pd.DataFrame, head_order: list[str]) -> pd.DataFrame:
    """Mean, sample std and count over seeds."""
    keys = ["backbone", "task", "split", "checkpoint", "model", "metric"]
    grouped = records.groupby(keys, sort=False)
    out = grouped["value"].agg(mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan, n="count")
    out["parameter_percent"] = grouped["parameter_percent"].first()
    out["tuned"] = grouped["tuned"].any()
    out["ensemble"] = grouped["ensemble"].first()
    out["flagged"] = grouped["flag"].count()
    out["flags"] = grouped["flag"].agg(lambda f: "; ".join(sorted(set(f.dropna()))))
    # runs cut short by the race (in the mean, flagged): the plots leave such rows out
    out["stopped"] = grouped["stopped"].sum().astype(int) if "stopped" in records else 0
    for key in QUESTION_COUNTS:
        out[key] = grouped[key].max() if key in records else np.nan
    out = out.reset_index()
    names = [BERT, *head_order, *(ensemble_name(h, how) for how in ENSEMBLES for h in head_order)]
    order = {name: i for i, name in enumerate(names)}
    out["_model_order"] = out["model"].map(order)
    out["_metric_order"] = [get_task(t).metrics.index(m) for t, m in zip(out["task"], out["metric"])]
    return (
        out.sort_values(["backbone", "task", "split", "checkpoint", "_model_order", "_metric_order"])
        .drop(columns=["_model_order", "_metric_order"])
        .reset_index(drop=True)
    )


def _section(block: pd.DataFrame, metrics: list[str], scale: float) -> str:
    rows = []
    for (checkpoint, model), g in block.groupby(["checkpoint", "model"], sort=False):
        by_metric = g.set_index("metric")
        n = int(g["n"].iloc[0])
        flagged = int(g["flagged"].max())
        reasons = "; ".join(sorted({r for f in g["flags"] for r in f.split("; ") if r}))
        rows.append(
            [
                f"{checkpoint:g}",
                model + (" †" if g["tuned"].any() else ""),
                f"{g['parameter_percent'].iloc[0]:.3f}",
                *[
                    fmt(by_metric.loc[m, "mean"], by_metric.loc[m, "std"], scale) if m in by_metric.index else "—"
                    for m in metrics
                ],  # e.g. HasAns on a slice with no answerable question
                str(n),
                f"⚠ {flagged}/{n}: {reasons}" if flagged else "",
            ]
        )
    return markdown_table(["epochs", "model", "% params", *metrics, "n", "flagged runs"], rows)


def results_markdown(summary: pd.DataFrame, title: str) -> str:
    parts = [
        f"# {title}",
        "",
        "Dev scores as mean ± sample std over seeds (n = number of runs). `BERT` is the backbone "
        "with its own classification head at that checkpoint (none at 0 epochs, where the head has not trained); "
        "the other rows are heads trained on that checkpoint's frozen hidden states. Head + BERT "
        "ensembles have their own section below. "
        "% params = trainable parameters as a share of the encoder's. `flagged runs` counts runs "
        "that predict one class for every example, give a constant output, abstain on every question, "
        "or score MCC / correlation ≈ 0, and runs the race stopped early (heads.race: cut short, never "
        "picked, left out of the score plots; the training-loss curves end where they stopped, and the "
        "cost-score plot shows them off its front); their numbers are in the mean, read them with that in mind.",
        "",
    ]
    keys = ["backbone", "task", "split"]
    for part, heading in (
        (summary[~summary["ensemble"].astype(bool)], None),
        (summary[summary["ensemble"].astype(bool)], "Head + BERT ensembles"),
    ):
        if part.empty:
            continue
        if heading:
            parts += [
                f"# {heading}",
                "",
                "The head's and BERT's output distributions at the same checkpoint, combined by their "
                "element-wise max or mean (two-class tasks: one row, as both pick the same class; "
                "regression: the mean of the two predictions). % params counts the fine-tuned encoder.",
                "",
            ]
        for (backbone, task, split), block in part.groupby(keys, sort=False):
            spec = get_task(task)
            parts += [
                f"## {task} ({backbone}, {split})",
                "",
                _section(block, list(spec.metrics), spec.metric_scale()),
                "",
            ]
            if spec.answerability and heading is None:
                parts += [no_window_note(block), ""]
    if summary["tuned"].any():
        parts.append("† hyperparameters chosen by the optuna search on the selection split (see search.md).")
        parts.append("")
    return "\n".join(parts)


def no_window_note(block: pd.DataFrame) -> str:
    """The answerability section's count of answerable questions none of whose windows holds the
    whole answer (records from before the count: a line that says so)."""
    questions, missed = block["questions"].max(), block["answerable_no_window"].max()
    if np.isnan(missed):
        return "Answerable questions without a whole-answer window: not counted in these records (rerun to count)."
    if missed == 0:
        return (
            f"Gold labels are the data's (a question is answerable when it has an answer). Every answerable one "
            f"of the {int(questions)} questions has a window that holds its whole answer."
        )
    return (
        f"Gold labels are the data's (a question is answerable when it has an answer). {int(missed)} of the "
        f"{int(questions)} questions are answerable but no window holds the whole answer (a doc_stride "
        'shorter than the answer): scored as answerable, while each of their windows trains as "no answer".'
    )


# The result tables: name -> (title, which tasks it holds). The config's own tasks
# (classification, regression) stand beside GLUE's.
TABLES = {
    "glue": ("GLUE results", lambda task: task.squad is None),
    "squad": ("SQuAD 2.0 results (span extraction and answerability)", lambda task: task.squad is not None),
}
SUMMARY_COLUMNS = [
    "backbone",
    "task",
    "split",
    "checkpoint",
    "model",
    "metric",
    "mean",
    "std",
    "n",
    "parameter_percent",
    "ensemble",
]


def result_tables(records: pd.DataFrame, head_order: list[str]) -> dict[str, tuple[pd.DataFrame, str]]:
    """Table name -> (summary, Markdown), for every entry of TABLES."""
    out = {}
    for name, (title, holds) in TABLES.items():
        part = records[[holds(get_task(t)) for t in records["task"]]] if len(records) else records
        summary = summarize(part, head_order) if len(part) else pd.DataFrame(columns=SUMMARY_COLUMNS)
        if len(part) and any(get_task(t).declared for t in part["task"].unique()):
            title = f"{title} and the config's own tasks"
        markdown = results_markdown(summary, title) if len(summary) else f"# {title}\n\nNo such task configured.\n"
        if len(summary):  # the question counts in the CSV: for answerability tasks only
            summary = summary.drop(columns=[k for k in QUESTION_COUNTS if summary[k].isna().all()])
        out[name] = (summary, markdown)
    return out
