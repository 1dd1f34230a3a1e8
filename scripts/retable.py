"""Rebuild a finished run's tables with this checkout's reporting code, from the run's own
records and benchmark files (nothing is trained again): how a change in the accounting moves
the figures of a run already made.

    python scripts/retable.py WORKDIR OUT_DIR [--heads lp ap ...]

The runs are every fine-tuning checkpoint under WORKDIR/models that has a heads directory and,
where the race decided (WORKDIR/race), only the checkpoints it reached; the extraction's shards
per checkpoint are read from the feature manifests. OUT_DIR gets the tables stage's files
(summary.md, cost.md, ...). Race decisions written before their best entry was named `candidate`
(ab8ab48) are read through a renamed copy under OUT_DIR/race-decisions. A run made before BERT's
head had its own scoring job (rule score_bert) scored it inside each fine-tuning job, whose
benchmark file counts it: such a checkpoint gets a score_bert benchmark file of 0 seconds in
WORKDIR/benchmarks (the only file this script writes there)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bertvision.jobs import Job
from bertvision.layout import BERT_METRICS, Checkpoint, Run, bert_record_file
from bertvision.stages.tables import build_tables


def current_decisions(paths: list[Path], copies: Path) -> list[Path]:
    """The race decisions as today's reporting reads them: an older file's ``best.head`` (which
    named a candidate, head or ensemble) becomes ``best.candidate`` in a copy."""
    current = []
    for path in paths:
        d = json.loads(path.read_text())
        best = d.get("best") or {}
        if "head" in best:
            d["best"] = {("candidate" if k == "head" else k): v for k, v in best.items()}
            path = copies / path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(d))
        current.append(path)
    return current


def extraction_shards(manifests: list[Path]) -> int:
    """Extraction jobs per checkpoint: each job writes one shard of every split."""
    counts = {len(split["shards"]) for m in manifests for split in json.loads(m.read_text())["splits"].values()}
    if len(counts) > 1:
        raise SystemExit(f"the runs' feature manifests disagree on the number of shards: {sorted(counts)}")
    return counts.pop() if counts else 1


def rebuild(workdir: Path, out_dir: Path, heads: list[str]) -> None:
    os.chdir(workdir)  # benchmark and log paths are relative to the working directory
    decisions = current_decisions(sorted(Path("race").glob("*/*/*.json")), out_dir / "race-decisions")
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
        run = Run(model, task, ft, Checkpoint.named(frac), manifest.exists())
        runs.append(run)
        record = ckpt / bert_record_file(run.checkpoint)
        bert.append(record if record.exists() else ckpt / BERT_METRICS)  # older runs: eval_metrics.json at 0
        scoring = Path(Job("score_bert", run.keys).benchmark)
        if (
            run.checkpoint.fraction > 0
            and not scoring.exists()
            and "scored_from" not in json.loads(bert[-1].read_text())
        ):
            scoring.parent.mkdir(parents=True, exist_ok=True)
            scoring.write_text("s\th:m:s\tmax_rss\n0.0\t0:00:00\t0.0\n")  # scored in the finetune job
        head_dirs.append(heads_dir)
        manifests += [manifest] if manifest.exists() else []
        workers += sorted((Path("search") / model / task / ckpt.parts[3] / ckpt.name).glob("*/worker-*.json"))
    baselines = sorted(Path("baselines").glob("*/*/seed*/metrics.json"))
    shards = extraction_shards(manifests)
    build_tables(bert, head_dirs, manifests, runs, shards, heads, out_dir.resolve(), baselines, workers, decisions)


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
