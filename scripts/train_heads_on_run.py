"""Train heads on a finished run's stored states at one checkpoint and print each head's mean
selection and dev scores over seeds: a head variant tried on real states without a rerun. The
heads are the run's config's (``--heads`` names them) plus any given as JSON specs.

    python scripts/train_heads_on_run.py RUN_DIR --config pairs.yaml --task pairs --ftseed 1 \\
        --checkpoint 0 --heads cosine adapter64-mean-apart \\
        --extra '{"cosine-adapter64": {"type": "cosine", "reads": "mean", "residual": 64}}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from bertvision.config.schema import validate_config
from bertvision.config.settings import HeadRuntimeSettings
from bertvision.config.workflow import WorkflowSettings, load_workflow_config
from bertvision.files import read_json
from bertvision.layout import HEAD_METRICS, MANIFEST, RAW_DIR, Run, head_runs
from bertvision.script_support import ScriptError, checkpoint_argument, known_task, run_directory, run_script
from bertvision.stages.train_heads import train_heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--config", default="config.yaml", help="the run's config, relative to RUN_DIR")
    parser.add_argument("--model", default=None, help="the backbone (default: the config's first)")
    parser.add_argument("--task", required=True)
    parser.add_argument("--ftseed", type=int, default=1)
    parser.add_argument("--checkpoint", type=checkpoint_argument, default="0")
    parser.add_argument("--heads", nargs="+", required=True, help="head names, of the config or of --extra")
    parser.add_argument("--extra", type=json.loads, default={}, help="JSON: name -> head spec, added to the config")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    args.run_dir = run_directory(args.run_dir).resolve()
    os.chdir(args.run_dir)  # a config's own files are relative to its run's directory
    config_file = args.run_dir / args.config
    config = load_workflow_config(config_file)
    config.setdefault("heads", {})
    config["heads"]["models"] = {**validate_config(config, str(config_file))["heads"]["models"], **args.extra}
    listed = (config["tasks"].get(args.task) or {}).get("heads")
    if listed is not None:  # a task that names its heads trains the extra ones too
        config["tasks"][args.task]["heads"] = [*listed, *args.extra]
    settings = WorkflowSettings(validate_config(config, str(config_file)), source=str(config_file))
    model = args.model or next(iter(settings.config["backbones"]))
    task = known_task(args.task)
    if args.task not in settings.tasks:
        raise ScriptError(f"--task {args.task}: not a task of {config_file} ({', '.join(settings.tasks)})")
    run = Run(model, args.task, args.ftseed, args.checkpoint)
    trained = settings.head_settings(args.task)
    unknown = [name for name in args.heads if name not in trained]
    if unknown:
        raise ScriptError(
            f"--heads: {', '.join(unknown)}: not a head {args.task} trains in {config_file} or --extra "
            f"({', '.join(trained)})"
        )
    heads = {name: head for name, head in trained.items() if name in args.heads}
    manifest = args.run_dir / run.format(MANIFEST)
    if not manifest.is_file():
        raise ScriptError(f"{manifest}: no such file (the run's stored states of that task, seed and checkpoint)")
    metric = task.primary_metric
    print(f"\n## {args.task}, fine-tuning seed {args.ftseed}, checkpoint {args.checkpoint}; head seeds {args.seeds}\n")
    print("| head | selection (mean) | dev mean ± std | best epochs |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out:
        raw = args.run_dir / run.format(RAW_DIR)
        train_heads(task, heads, HeadRuntimeSettings(device="cpu", verify="size"), manifest, args.seeds, Path(out),
                    threads=1, raw_dir=raw)  # fmt: skip
        records: dict[str, list[dict]] = {}
        for run_dir in head_runs(Path(out)):
            record = read_json(run_dir / HEAD_METRICS)
            records.setdefault(record["head"], []).append(record)
    for name in args.heads:
        kept = records[name]
        selection = statistics.mean(r["metrics"]["selection"][metric] for r in kept)
        dev = [r["metrics"]["dev"][metric] for r in kept]
        spread = statistics.stdev(dev) if len(dev) > 1 else 0.0
        epochs = [r["best_epoch"] for r in kept]
        print(f"| {name} | {selection:.4f} | {statistics.mean(dev):.4f} ± {spread:.4f} | {epochs} |")


if __name__ == "__main__":
    run_script(main)
