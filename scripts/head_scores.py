"""Per head of one checkpoint's head jobs: what it reads and its mean selection and dev scores over
its seeds, read from the head records (nothing is trained): the race's view beside the dev one.
Runs the race stopped early are left out (their count is printed).

    python scripts/head_scores.py RUN_DIR --model minilm-l6 --tasks sst2 mrpc stsb [--ftseed 1 --checkpoint 0] \\
        [--config CONFIG (declares own tasks)]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bertvision.files import read_json
from bertvision.layout import HEAD_METRICS, HEADS_DIR, Run, head_runs
from bertvision.registry.heads import head_reads
from bertvision.reporting.results import raced_out
from bertvision.script_support import (
    ScriptError,
    add_config_argument,
    checkpoint_argument,
    declare_config_tasks,
    known_task,
    run_directory,
    run_script,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--ftseed", type=int, default=1)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default="0")
    add_config_argument(parser)
    args = parser.parse_args()
    run_directory(args.run_dir, "heads")
    declare_config_tasks(args.config, args.run_dir)
    per_task: dict[str, dict[str, list[dict]]] = {}
    left_out = 0
    for task in args.tasks:
        known_task(task)
        heads_dir = args.run_dir / Run(args.model, task, args.ftseed, args.checkpoint).format(HEADS_DIR)
        records = [read_json(run_dir / HEAD_METRICS) for run_dir in head_runs(heads_dir)]
        if not records:
            raise ScriptError(f"{heads_dir}: no head records (model, ft seed or checkpoint not in this run?)")
        left_out += sum(map(raced_out, records))
        per_task[task] = {}
        for record in records:
            if not raced_out(record):
                per_task[task].setdefault(record["head"], []).append(record)
    print("| task | metric | head | reads | selection (mean over seeds) | dev mean ± std | n |")
    print("|---|---|---|---|---|---|---|")
    for task, per_head in per_task.items():
        metric = known_task(task).primary_metric
        for head, kept in sorted(per_head.items()):
            selection = [r["metrics"]["selection"][metric] for r in kept]
            dev = [r["metrics"]["dev"][metric] for r in kept]
            spread = statistics.stdev(dev) if len(dev) > 1 else 0.0
            print(
                f"| {task} | {metric} | {head} | {head_reads(kept[0]['head_spec'])} | "
                f"{statistics.mean(selection):.3f} | {statistics.mean(dev):.3f} ± {spread:.3f} | {len(dev)} |"
            )
    print(f"\n{left_out} head runs the race stopped early left out")


if __name__ == "__main__":
    run_script(main)
