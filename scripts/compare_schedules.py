"""Heads on partial checkpoints of two fine-tuning schedules, compared on the SELECTION split.

Issue 21's question: does a checkpoint at c epochs give better heads when it is a snapshot of a
learning-rate schedule that spans more epochs (``finetune.settings.schedule_epochs``) than when
the schedule ends at the largest checkpoint (``null``)? Give two finished run directories that
differ only in that setting. Per task, checkpoint and head: the mean selection score over every
fine-tuning seed x head seed of each run, BERT's own head likewise, and the dev scores beside
them for the record (never used for the choice). The decision reads the selection columns only;
equal scores are ties, counted apart. Head runs the race stopped early are left out (their count
is printed).

    python scripts/compare_schedules.py RUN_A RUN_B --labels "schedule 1" "schedule 3" [--out FILE.md] \
        [--config CONFIG (declares own tasks)]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.files import read_json
from bertvision.layout import BERT_METRICS, CHECKPOINT_FILE, HEADS_DIR, head_metrics_pattern
from bertvision.reporting.results import raced_out
from bertvision.script_support import (
    add_config_argument,
    declare_config_tasks,
    known_task,
    one_backbone,
    run_directory,
    run_script,
)

EVERY_RUN = {"model": "*", "task": "*", "ftseed": "*", "checkpoint": "*"}
HEAD_RECORDS = head_metrics_pattern(HEADS_DIR.format(**EVERY_RUN))
BERT_RECORDS = CHECKPOINT_FILE.format(**EVERY_RUN, file=BERT_METRICS)


def records(run_dir: Path) -> tuple[pd.DataFrame, int]:
    """One row per head run and per BERT checkpoint (checkpoints > 0), with its keys; and the
    count of head runs left out, those the race stopped early."""
    rows, left_out = [], 0
    heads = [read_json(path) for path in sorted(run_dir.glob(HEAD_RECORDS))]
    one_backbone(heads, run_dir)
    for r in heads:
        if raced_out(r):
            left_out += 1
            continue
        task = known_task(r["task"])
        rows.append(
            {
                "task": task.name,
                "checkpoint": float(r["source"]["checkpoint"]),
                "model": r["head"],
                "ft_seed": int(r["source"]["ft_seed"]),
                "selection": task.primary_score(r["metrics"], "selection"),
                "dev": task.headline(r["metrics"]),
            }
        )
    for path in sorted(run_dir.glob(BERT_RECORDS)):
        r = read_json(path)
        r.setdefault("checkpoint", r.get("epoch_fraction"))  # a record written before the one spelling
        if float(r["checkpoint"]) == 0:
            continue
        task = known_task(r["task"])
        rows.append(
            {
                "task": task.name,
                "checkpoint": float(r["checkpoint"]),
                "model": "BERT",
                "ft_seed": int(r["seed"]),
                "selection": task.primary_score(r["metrics"], "selection"),
                "dev": task.headline(r["metrics"]),
            }
        )
    return pd.DataFrame(rows), left_out


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    g = frame.groupby(["task", "checkpoint", "model"])
    return g.agg(
        selection=("selection", "mean"), dev=("dev", "mean"), dev_std=("dev", "std"), n=("dev", "size")
    ).reset_index()


def compare(a: Path, b: Path, labels: tuple[str, str]) -> tuple[pd.DataFrame, str]:
    (ra, left_a), (rb, left_b) = records(a), records(b)
    sa, sb = summarize(ra), summarize(rb)
    both = sa.merge(sb, on=["task", "checkpoint", "model"], suffixes=(" A", " B"))
    both["selection B - A"] = both["selection B"] - both["selection A"]
    heads = both[both["model"] != "BERT"]
    wins_b, wins_a = int((heads["selection B - A"] > 0).sum()), int((heads["selection B - A"] < 0).sum())
    verdict = (
        f"Over {len(heads)} (task, checkpoint, head) cells, {labels[1]} has the higher mean selection score in "
        f"{wins_b} and {labels[0]} in {wins_a}, {len(heads) - wins_a - wins_b} tied; mean difference "
        f"{heads['selection B - A'].mean():+.4f} (selection, {labels[1]} minus {labels[0]}); head runs the race "
        f"stopped early, left out: {left_a} of {labels[0]}'s, {left_b} of {labels[1]}'s. Best head per task and "
        "checkpoint by selection: "
    )
    picks = []
    for (task, checkpoint), g in heads.groupby(["task", "checkpoint"]):
        best_a, best_b = g["selection A"].max(), g["selection B"].max()
        better = labels[1] if best_b > best_a else labels[0] if best_a > best_b else "tie"
        picks.append(f"{task} @ {checkpoint:g}: {better}")
    return both, verdict + "; ".join(picks) + "."


def markdown(both: pd.DataFrame, verdict: str, labels: tuple[str, str]) -> str:
    head = ["task", "epochs", "model", f"selection {labels[0]}", f"selection {labels[1]}", "Δ selection",
            f"dev {labels[0]}", f"dev {labels[1]}", "n"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def score(r, side: str) -> str:
        std = r[f"dev_std {side}"]
        return f"{r[f'dev {side}']:.3f} ± {0.0 if np.isnan(std) else std:.3f}"

    for _, r in both.sort_values(["task", "checkpoint", "model"]).iterrows():
        cells = [r["task"], f"{r['checkpoint']:g}", r["model"], f"{r['selection A']:.4f}", f"{r['selection B']:.4f}",
                 f"{r['selection B - A']:+.4f}", score(r, "A"), score(r, "B"), f"{r['n A']}/{r['n B']}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([verdict, "", *lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--labels", nargs=2, default=("A", "B"))
    parser.add_argument("--out", type=Path)
    add_config_argument(parser)
    args = parser.parse_args()
    for run_dir in (args.run_a, args.run_b):
        run_directory(run_dir, HEAD_RECORDS)
    declare_config_tasks(args.config, args.run_a)
    both, verdict = compare(args.run_a, args.run_b, tuple(args.labels))
    text = markdown(both, verdict, tuple(args.labels))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    run_script(main)
