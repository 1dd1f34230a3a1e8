"""The ``tables`` stage: result tables built from the metrics files and Snakemake's benchmark
files; nothing is typed in by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.flags import metric_flag, prediction_flags
from bertvision.io import atomic_path, read_json
from bertvision.tasks import get_task

BERT = "BERT"


def _reported(metrics_record: dict):
    """(split, metrics) of the evaluation splits only (span tasks also score selection)."""
    task = get_task(metrics_record["task"])
    return [(split, {k: v for k, v in values.items() if k in task.metrics})
            for split, values in metrics_record["metrics"].items() if split in task.eval_splits]


def ensemble_name(head: str, how: str) -> str:
    return f"{head} + BERT ({how})"


def _flag(run_flags: dict, split: str, metric: str, value: float) -> str | None:
    return run_flags.get(split) or metric_flag(metric, value)


def long_records(bert_metrics: list[Path], head_metrics: list[Path]) -> pd.DataFrame:
    """One row per (run, eval split, metric), with the run's degenerate-run flag if any."""
    rows = []
    for path in bert_metrics:
        m = read_json(path)
        flags = prediction_flags(Path(path).with_name("eval_predictions.parquet"), get_task(m["task"]))
        for split, values in _reported(m):
            for metric, value in values.items():
                rows.append({"task": m["task"], "split": split, "epoch_fraction": m["epoch_fraction"],
                             "model": BERT, "seed": m["seed"], "metric": metric, "value": value,
                             "parameter_percent": 100.0, "flag": _flag(flags, split, metric, value),
                             "tuned": False})
    for path in head_metrics:
        m = read_json(path)
        fraction = float(m["source"]["checkpoint"])
        seed = f"{m['source'].get('ft_seed', '')}/{m['seed']}"
        flags = prediction_flags(Path(path).with_name("eval_predictions.parquet"), get_task(m["task"]))
        for split, values in _reported(m):
            for metric, value in values.items():
                rows.append({"task": m["task"], "split": split, "epoch_fraction": fraction, "model": m["head"],
                             "seed": seed, "metric": metric, "value": value,
                             "parameter_percent": m["parameter_percent"], "flag": _flag(flags, split, metric, value),
                             "tuned": m.get("search") is not None})
        for how, ens in m.get("ensembles", {}).items():
            for split, values in _reported({"task": m["task"], "metrics": ens}):
                for metric, value in values.items():
                    rows.append({"task": m["task"], "split": split, "epoch_fraction": fraction,
                                 "model": ensemble_name(m["head"], how), "seed": seed, "metric": metric,
                                 "value": value, "parameter_percent": 100.0 + m["parameter_percent"],
                                 "flag": metric_flag(metric, value), "tuned": m.get("search") is not None})
    return pd.DataFrame(rows)


def summarize(records: pd.DataFrame, head_order: list[str]) -> pd.DataFrame:
    """Mean, sample std and count over seeds."""
    keys = ["task", "split", "epoch_fraction", "model", "metric"]
    grouped = records.groupby(keys, sort=False)
    out = grouped["value"].agg(mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan, n="count")
    out["parameter_percent"] = grouped["parameter_percent"].first()
    out["tuned"] = grouped["tuned"].any()
    out["flagged"] = grouped["flag"].count()
    out["flags"] = grouped["flag"].agg(lambda f: "; ".join(sorted(set(f.dropna()))))
    out = out.reset_index()
    names = [BERT, *head_order, *(ensemble_name(h, how) for how in ("max", "mean") for h in head_order)]
    order = {name: i for i, name in enumerate(names)}
    out["_model_order"] = out["model"].map(order)
    out["_metric_order"] = [get_task(t).metrics.index(m) for t, m in zip(out["task"], out["metric"])]
    return out.sort_values(["task", "split", "epoch_fraction", "_model_order", "_metric_order"]).drop(
        columns=["_model_order", "_metric_order"]
    ).reset_index(drop=True)


def _fmt(mean: float, std: float) -> str:
    digits = 2 if abs(mean) > 1.5 else 3  # SQuAD scores are on a 0-100 scale
    return f"{mean:.{digits}f}" if np.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def results_markdown(summary: pd.DataFrame, title: str) -> str:
    parts = [f"# {title}", "",
             "Dev scores as mean ± sample std over seeds (n = number of runs). `BERT` is the backbone "
             "with its own classification head at that checkpoint (at 0 epochs the head is untrained); "
             "the other rows are heads trained on that checkpoint's frozen hidden states, and "
             "`head + BERT` ensembles of the two (max or mean of their softmax distributions). "
             "% params = trainable parameters as a share of the encoder's. `degenerate runs` counts runs "
             "that predict one class for every example, give a constant output, abstain on every question, "
             "or score MCC / correlation ≈ 0; their numbers are in the mean, read them with that in mind.", ""]
    for (task, split), block in summary.groupby(["task", "split"], sort=False):
        metrics = list(get_task(task).metrics)
        parts.append(f"## {task} ({split})")
        parts.append("")
        rows = []
        for (frac, model), g in block.groupby(["epoch_fraction", "model"], sort=False):
            by_metric = g.set_index("metric")
            n = int(g["n"].iloc[0])
            flagged = int(g["flagged"].max())
            reasons = "; ".join(sorted({r for f in g["flags"] for r in f.split("; ") if r}))
            rows.append([f"{frac:g}", model + (" †" if g["tuned"].any() else ""),
                         f"{g['parameter_percent'].iloc[0]:.3f}",
                         *[_fmt(by_metric.loc[m, "mean"], by_metric.loc[m, "std"]) for m in metrics],
                         str(n), f"⚠ {flagged}/{n}: {reasons}" if flagged else ""])
        parts.append(markdown_table(["epochs", "model", "% params", *metrics, "n", "degenerate runs"], rows))
        parts.append("")
    if summary["tuned"].any():
        parts.append("† hyperparameters chosen by the optuna search on the selection split (see search.md).")
        parts.append("")
    return "\n".join(parts)


def timing_table(benchmarks: list[Path], root: Path = Path("benchmarks")) -> pd.DataFrame:
    """Wall seconds per (stage, task) from ``benchmarks/{stage}/{task}[/...].tsv`` files."""
    rows = []
    for path in benchmarks:
        rel = Path(path).relative_to(root)
        stage, task = rel.parts[0], Path(rel.parts[1]).stem
        bench = pd.read_csv(path, sep="\t")
        rows.append({"stage": stage, "task": task, "seconds": float(bench["s"].iloc[0]),
                     "max_rss_mb": float(pd.to_numeric(bench["max_rss"], errors="coerce").iloc[0])})
    df = pd.DataFrame(rows, columns=["stage", "task", "seconds", "max_rss_mb"])
    return (df.groupby(["task", "stage"], sort=True)
              .agg(jobs=("seconds", "size"), seconds=("seconds", "sum"), max_rss_mb=("max_rss_mb", "max"))
              .reset_index())


STAGE_ORDER = ["download", "tokenize", "finetune", "extract", "feature_manifest", "train_heads"]


def timing_markdown(timing: pd.DataFrame) -> str:
    stages = [s for s in STAGE_ORDER if s in set(timing["stage"])] + sorted(set(timing["stage"]) - set(STAGE_ORDER))
    pivot = timing.pivot_table(index="task", columns="stage", values="seconds", aggfunc="sum").reindex(columns=stages)
    rows = [[task, *[("" if np.isnan(v) else f"{v:.1f}") for v in r], f"{np.nansum(r):.1f}"]
            for task, r in zip(pivot.index, pivot.to_numpy())]
    total = pivot.sum(axis=0)
    rows.append(["**all**", *[f"{v:.1f}" for v in total], f"{total.sum():.1f}"])
    return "\n".join(["# Wall time per stage (seconds, summed over jobs)", "",
                      "From Snakemake `benchmark:` files; jobs ran in parallel, so the sum exceeds the elapsed time.",
                      "", markdown_table(["task", *stages, "total"], rows), ""])


def write_text(text: str, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")


TABLES = {  # output key -> (title, which task kinds)
    "": ("GLUE results", {"classification", "regression"}),
    "squad_": ("SQuAD 2.0 results", {"span"}),
}


def build_tables(bert_metrics, head_metrics, benchmarks, head_order, outputs: dict, manifests=()) -> None:
    records = long_records(bert_metrics, head_metrics)
    for prefix, (title, kinds) in TABLES.items():
        part = records[[get_task(t).kind in kinds for t in records["task"]]] if len(records) else records
        summary = summarize(part, head_order) if len(part) else pd.DataFrame(
            columns=["task", "split", "epoch_fraction", "model", "metric", "mean", "std", "n", "parameter_percent"])
        write_csv(summary, outputs[f"{prefix}csv"])
        write_text(results_markdown(summary, title) if len(summary) else f"# {title}\n\nNo such task configured.\n",
                   outputs[f"{prefix}md"])
    from bertvision.costs import cost_markdown, cost_table

    costs = cost_table(bert_metrics, head_metrics, manifests, benchmarks)
    write_csv(costs, outputs["cost_csv"])
    write_text(cost_markdown(costs), outputs["cost_md"])
    timing = timing_table(benchmarks)
    write_csv(timing, outputs["timing_csv"])
    write_text(timing_markdown(timing), outputs["timing_md"])
