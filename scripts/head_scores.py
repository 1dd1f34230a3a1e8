"""Per head of one checkpoint's head jobs: what it reads and its mean selection and dev scores over
its seeds, read from the head records (nothing is trained): the race's view beside the dev one.

    python scripts/head_scores.py RUN_DIR --model minilm-l6 --tasks sst2 mrpc stsb [--ftseed 1 --checkpoint 0]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bertvision.files import read_json
from bertvision.layout import HEAD_METRICS, HEADS_DIR, Checkpoint, Run, head_runs
from bertvision.registry.heads import head_reads
from bertvision.registry.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--ftseed", type=int, default=1)
    parser.add_argument("--checkpoint", default="0")
    args = parser.parse_args()
    print("| task | metric | head | reads | selection (mean over seeds) | dev mean ± std | n |")
    print("|---|---|---|---|---|---|---|")
    for task in args.tasks:
        metric = get_task(task).primary_metric
        run = Run(args.model, task, args.ftseed, Checkpoint.named(args.checkpoint))
        per_head: dict[str, list[dict]] = {}
        for run_dir in head_runs(args.run_dir / run.format(HEADS_DIR)):
            record = read_json(run_dir / HEAD_METRICS)
            per_head.setdefault(record["head"], []).append(record)
        for head, records in sorted(per_head.items()):
            selection = [r["metrics"]["selection"][metric] for r in records]
            dev = [r["metrics"]["dev"][metric] for r in records]
            spread = statistics.stdev(dev) if len(dev) > 1 else 0.0
            print(
                f"| {task} | {metric} | {head} | {head_reads(records[0]['head_spec'])} | "
                f"{statistics.mean(selection):.3f} | {statistics.mean(dev):.3f} ± {spread:.3f} | {len(dev)} |"
            )


if __name__ == "__main__":
    main()
