"""The race's checkpoint rules replayed on a grid run (every head, seed and checkpoint trained to
its end): per task and rule, where fine-tuning would have stopped, the pick over the checkpoints it
reached (the one ranking, on selection) and that pick's dev score, beside the grid's own pick.
Nothing is trained; the decisions are the race stage's own (``stages.race.decide_checkpoint``).

    python scripts/checkpoint_rules.py RUN_DIR --model minilm-l6 --tasks review-sentiment review-site \\
        --ftseeds 1 2 3 --checkpoints 0 0.3 1 [--min-gain 0.005] [--config CONFIG (declares own tasks)]

"stopped after" is the last checkpoint the rule's decisions reached; every checkpoint given must
have head records in the run for every task and fine-tuning seed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bertvision.config.settings import RaceSettings
from bertvision.files import read_json
from bertvision.layout import HEADS_DIR, Checkpoint, Run, head_metrics_files
from bertvision.reporting.ranking import best, head_candidates
from bertvision.reporting.results import ensemble_name
from bertvision.script_support import (
    ScriptError,
    add_config_argument,
    checkpoint_argument,
    declare_config_tasks,
    known_task,
    run_directory,
    run_script,
)
from bertvision.stages.race import decide_checkpoint

RULES = ("gain", "spread")


def head_dirs(run_dir: Path, model: str, task: str, ftseeds: list[int], checkpoint: Checkpoint) -> list[Path]:
    seeds = ftseeds[:1] if checkpoint.fraction == 0 else ftseeds  # checkpoint 0: one run (Run.states_owner)
    return [run_dir / Run(model, task, seed, checkpoint).format(HEADS_DIR) for seed in seeds]


def dev_scores(task, dirs: list[Path], candidate: str) -> list[float]:
    scores = []
    for path in head_metrics_files(dirs):
        record = read_json(path)
        if record["head"] == candidate:
            scores.append(task.primary_score(record["metrics"], "dev"))
        for how, metrics in (record.get("ensembles") or {}).items():
            if ensemble_name(record["head"], how) == candidate:
                scores.append(task.primary_score(metrics, "dev"))
    return scores


def pick_over(task, per_checkpoint: dict[Checkpoint, list[Path]]) -> tuple[Checkpoint, str, float, list[float]]:
    candidates = []
    for checkpoint, dirs in per_checkpoint.items():
        records = [read_json(path) for path in head_metrics_files(dirs)]
        candidates += head_candidates(task, records, checkpoint.fraction)
    top = best(candidates)
    checkpoint = next(c for c in per_checkpoint if c.fraction == top.checkpoint)
    return checkpoint, top.name, top.selection, dev_scores(task, per_checkpoint[checkpoint], top.name)


def described(scores: list[float]) -> str:
    spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
    return f"{statistics.mean(scores):.3f} ± {spread:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--ftseeds", nargs="+", type=int, required=True)
    parser.add_argument("--checkpoints", nargs="+", type=checkpoint_argument, required=True)
    parser.add_argument("--min-gain", type=float, default=0.005)
    add_config_argument(parser)
    args = parser.parse_args()
    run_directory(args.run_dir, "heads")
    declare_config_tasks(args.config, args.run_dir)
    checkpoints = sorted(set(args.checkpoints))
    for name in args.tasks:
        known_task(name)
        for checkpoint in checkpoints:
            for path in head_dirs(args.run_dir, args.model, name, args.ftseeds, checkpoint):
                if not head_metrics_files([path]):
                    raise ScriptError(f"--checkpoints {checkpoint.name}: {path}: no head records in this run")
    print("| task | rule | decisions (checkpoint: best selection, gain) | stopped after | pick | selection | dev |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.tasks:
            task = known_task(name)
            dirs = {c: head_dirs(args.run_dir, args.model, name, args.ftseeds, c) for c in checkpoints}
            for rule in RULES:
                race = RaceSettings(protocol="racing", rungs=(2,), keep=0.5, min_gain=args.min_gain,
                                    checkpoint_rule=rule)  # fmt: skip
                previous, reached, steps = None, {}, []
                for i, checkpoint in enumerate(checkpoints):
                    out = Path(scratch) / name / rule / f"{checkpoint.name}.json"
                    decision = decide_checkpoint(task, args.model, checkpoint, dirs[checkpoint], race, out,
                                                 previous, last=i == len(checkpoints) - 1)  # fmt: skip
                    reached[checkpoint] = dirs[checkpoint]
                    steps.append(f"{checkpoint.name}: {decision['why']}")
                    previous = out
                    if not decision["go_on"]:
                        break
                stopped = list(reached)[-1]
                checkpoint, head, selection, dev = pick_over(task, reached)
                print(f"| {name} | {rule} | {'; '.join(steps)} | {stopped.name} | {head} at {checkpoint.name} "
                      f"| {selection:.4f} | {described(dev)} |")  # fmt: skip
            checkpoint, head, selection, dev = pick_over(task, dirs)
            print(f"| {name} | grid | every checkpoint | {checkpoints[-1].name} | {head} at {checkpoint.name} "
                  f"| {selection:.4f} | {described(dev)} |")  # fmt: skip


if __name__ == "__main__":
    run_script(main)
