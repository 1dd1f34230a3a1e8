"""Rebuild a finished run's tables with this checkout's reporting code, from the run's own
records and benchmark files (nothing is trained again): how a change in the accounting moves
the figures of a run already made.

    python scripts/retable.py WORKDIR OUT_DIR [--heads lp ap ...]

The runs are every fine-tuning checkpoint under WORKDIR/models that has a heads directory and,
where the race decided (WORKDIR/race), only the checkpoints it reached; extraction is taken as one
shard per checkpoint (the default). OUT_DIR gets the tables stage's files (summary.md, cost.md, ...).
Then, for a grid run and a racing run: each task's pick and its whole cost against full fine-tuning."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bertvision.layout import Checkpoint, Run
from bertvision.stages.tables import build_tables


def rebuild(workdir: Path, out_dir: Path, heads: list[str]) -> None:
    os.chdir(workdir)  # benchmark and log paths are relative to the working directory
    decisions = sorted(Path("race").glob("*/*/*.json"))
    reached: dict[tuple, set] = {}
    for path in decisions:
        d = json.loads(path.read_text())
        reached.setdefault((d["model"], d["task"]), set()).add(d["checkpoint"])
    runs, bert, head_dirs, manifests, workers = [], [], [], [], []
    for ckpt in sorted(Path("models").glob("*/*/ft*/ckpt-*")):
        model, task, ft = ckpt.parts[1], ckpt.parts[2], int(ckpt.parts[3][2:])
        frac = ckpt.name.removeprefix("ckpt-")
        heads_dir = Path("heads") / model / task / ckpt.parts[3] / ckpt.name
        if not heads_dir.is_dir() or (decisions and frac not in reached.get((model, task), set())):
            continue
        manifest = Path("features") / model / task / ckpt.parts[3] / ckpt.name / "manifest.json"
        runs.append(Run(model, task, ft, Checkpoint.named(frac), manifest.exists()))
        bert.append(ckpt / "eval_metrics.json")
        head_dirs.append(heads_dir)
        manifests += [manifest] if manifest.exists() else []
        workers += sorted((Path("search") / model / task / ckpt.parts[3] / ckpt.name).glob("*/worker-*.json"))
    baselines = sorted(Path("baselines").glob("*/*/seed*/metrics.json"))
    build_tables(bert, head_dirs, manifests, runs, 1, heads, out_dir.resolve(), baselines, workers, decisions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--heads", nargs="*", default=["lp", "ap", "adapter64", "adapter64-skip", "tokpool"])
    args = parser.parse_args()
    out_dir = args.out_dir.resolve()
    rebuild(args.workdir, out_dir, args.heads)
    print(f"tables written to {out_dir}")


if __name__ == "__main__":
    main()
