"""Per task: full fine-tuning, the best existing head (picked on the selection split among the
heads other than the new one, on every checkpoint) and the new head at each checkpoint, with
dev mean ± std over every fine-tuning seed x head seed and each path's whole cost against full
fine-tuning's.

A head path's whole cost here is what that path alone took, per fine-tuning seed: the
fine-tuning to its checkpoint, the checkpoint's extraction and every seed of that head (the
summary's picks add every other candidate too: ``summary.md``). Full fine-tuning's is every
epoch it trained. The goal of issue 21 is checked per row: within one std of full fine-tuning
(or above it) at no more than 0.30x its whole compute.

Head runs the race stopped early (``reporting.results.raced_out``) are left out of every score.

    python scripts/head_paths.py RUN_DIR --new ladder [--out FILE.md] [--config CONFIG (declares own tasks)]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision import layout as L
from bertvision.files import read_json
from bertvision.layout import HEADS_DIR, head_metrics_files
from bertvision.reporting.results import raced_out, repeats_frozen_run
from bertvision.script_support import (
    ScriptError,
    add_config_argument,
    declare_config_tasks,
    known_task,
    one_backbone,
    run_directory,
    run_script,
)

GOAL_COST = 0.30

EVERY_HEADS_DIR = HEADS_DIR.format(model="*", task="*", ftseed="*", checkpoint="*")


def head_records(run_dir: Path, runs: set) -> tuple[pd.DataFrame, int]:
    """The head records of the runs the tables cover (``runs``: (task, ft seed, checkpoint)) but
    those the race stopped early, and how many of those were left out."""
    rows, frozen_seen, left_out = [], set(), 0
    records = [read_json(p) for p in head_metrics_files(sorted(run_dir.glob(EVERY_HEADS_DIR)))]
    one_backbone(records, run_dir)
    for r in sorted(records, key=lambda r: int(r["source"]["ft_seed"])):
        if (r["task"], int(r["source"]["ft_seed"]), float(r["source"]["checkpoint"])) not in runs:
            continue
        if raced_out(r):
            left_out += 1
            continue
        if repeats_frozen_run(r, frozen_seen):  # the untouched encoder's runs count once
            continue
        task = known_task(r["task"])
        rows.append(
            {
                "task": task.name,
                "checkpoint": float(r["source"]["checkpoint"]),
                "model": r["head"],
                "selection": task.primary_score(r["metrics"], "selection"),
                "dev": task.headline(r["metrics"]),
                "percent": r["parameter_percent"],
            }
        )
    return pd.DataFrame(rows), left_out


def fmt(mean: float, std: float, scale: float) -> str:
    return f"{mean * scale:.1f} ± {0.0 if np.isnan(std) else std * scale:.1f}"


def path_cell(configs: pd.DataFrame, key: tuple, seconds: float, full: pd.Series, scale: float) -> tuple[str, bool]:
    """A head at a checkpoint (``key``: (epoch fraction, model)): dev ± std, whole cost ratio,
    and whether it meets the goal."""
    if key not in configs.index:
        return "", False
    c = configs.loc[key]
    ratio = seconds / full["whole_seconds"]
    within = c["dev"] >= full["dev_mean"] - (0 if np.isnan(full["dev_std"]) else full["dev_std"])
    met = bool(within and ratio <= GOAL_COST)
    return f"{fmt(c['dev'], c['std'], scale)} ({ratio:.2f}×){' ✓' if met else ''}", met


def table(run_dir: Path, new: str, tables: Path | None = None) -> str:
    tables = tables or run_dir / L.TABLES_DIR
    summary_file, cost_file = (Path(L.table(name, "csv", str(tables))) for name in ("summary", "cost"))
    for path in (summary_file, cost_file):
        if not path.is_file():
            raise ScriptError(f"{path}: no such file (the run's tables: --tables)")
    old_spelling = {"epoch_fraction": "checkpoint"}  # tables written before the checkpoint's one spelling
    summary = pd.read_csv(summary_file).rename(columns=old_spelling)
    costs = pd.read_csv(cost_file).rename(columns=old_spelling)
    costs["path_s"] = costs["finetune_s"] + costs["extract_s"] + costs["head_s"] * costs["n"]
    path_s = costs.groupby(["task", "checkpoint", "model"])["path_s"].mean()
    heads, left_out = head_records(run_dir, set(zip(costs["task"], costs["ft_seed"], costs["checkpoint"])))
    if heads.empty:
        raise ScriptError(f"{run_dir}: no head records of the runs {cost_file} covers")
    lines = [
        "| task | metric | full FT (whole s) | best existing head (selection) | "
        f"{new} at 0 | {new} at 0.3 | {new} at 1 | goal met by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    met_tasks = 0
    for task_name, block in heads.groupby("task", sort=True):
        task = known_task(task_name)
        scale = 100 / task.metric_scale()
        full = summary[(summary["task"] == task_name) & (summary["row"] == "full fine-tuning")]
        if full.empty:
            continue
        full = full.iloc[0]
        configs = block.groupby(["checkpoint", "model"]).agg(
            selection=("selection", "mean"), dev=("dev", "mean"), std=("dev", "std"), n=("dev", "size")
        )

        existing = configs[configs.index.get_level_values("model") != new]
        best = existing["selection"].idxmax()

        def cell(key: tuple, task_name=task_name, configs=configs, full=full, scale=scale) -> tuple[str, bool]:
            return path_cell(configs, key, path_s.get((task_name, *key), np.nan), full, scale)

        best_cell, best_met = cell(best)
        new_cells = [cell((checkpoint, new)) for checkpoint in (0.0, 0.3, 1.0)]
        met = [f"{best[1]} at {best[0]:g}"] * best_met + [
            f"{new} at {checkpoint:g}" for checkpoint, (_, ok) in zip((0, 0.3, 1), new_cells) if ok
        ]
        met_tasks += bool(met)
        lines.append(
            f"| {task_name} | {task.primary_metric} | {fmt(full['dev_mean'], full['dev_std'], scale)} "
            f"({full['whole_seconds']:.0f} s) | {best[1]} at {best[0]:g}: {best_cell} | "
            + " | ".join(c for c, _ in new_cells)
            + f" | {', '.join(met) or 'none'} |"
        )
    return "\n".join(
        [
            f"Dev scores (× 100) mean ± std over fine-tuning seeds × head seeds; in brackets each path's whole "
            f"cost / full fine-tuning's (fine-tuning to the checkpoint + its extraction + every seed of that "
            f"head; full fine-tuning: every epoch). ✓: within one std of full fine-tuning (or above) at "
            f"≤ {GOAL_COST:.2f}× its whole compute. Tasks where some path meets it: {met_tasks}. Head runs the race "
            f"stopped early, left out: {left_out}.",
            "",
            *lines,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--new", default="ladder", help="the head to show at each checkpoint")
    parser.add_argument("--tables", type=Path, help="the tables directory (default: RUN_DIR/results/tables)")
    parser.add_argument("--out", type=Path)
    add_config_argument(parser)
    args = parser.parse_args()
    run_directory(args.run_dir, "heads")
    declare_config_tasks(args.config, args.run_dir)
    text = table(args.run_dir, args.new, args.tables)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    run_script(main)
