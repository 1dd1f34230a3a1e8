"""Heads trained one by one vs together, on one checkpoint's stored states: the seconds of each
way, their ratio, and whether every head's weights and scores are identical (they must be).

One by one is how a head-training job trained stored features before heads were trained in
lockstep: each head and seed in turn, the states read once for the job. Together: every head of
a seed in lockstep (``train_together``), each batch drawn once for all of them.

    python scripts/benchmark_heads_together.py --task review-sentiment \\
        --manifest /tmp/example/features/minilm-l6/review-sentiment/ft1/ckpt-0/manifest.json \\
        --config configs/example-own-task.yaml --seeds 1 2
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from bertvision.config.schema import validate_config
from bertvision.config.settings import HeadRuntimeSettings
from bertvision.config.workflow import WorkflowSettings, load_workflow_config
from bertvision.registry.heads import is_token_head
from bertvision.registry.tasks import get_task
from bertvision.runtime.device import set_threads
from bertvision.script_support import run_script
from bertvision.training.loop import SeededHead, train_together
from bertvision.training.problems import Problems


def head_runs(settings: WorkflowSettings, task: str, problems: Problems, seeds: list[int]) -> list[SeededHead]:
    runs = []
    for name, head in settings.head_settings(task).items():
        if is_token_head(head.spec):
            continue  # [CLS] states only in this benchmark
        moments = problems.moments(head.spec) if head.training.standardize else None
        runs += [SeededHead(name, head.spec, head.training, seed, moments, problems.encoder_dir) for seed in seeds]
    return runs


def weights(head) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.clone() for k, v in head.state_dict().items()}, buffer)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each way, alternated")
    parser.add_argument("--device", default="cpu", help="where the heads train: cpu, or cuda where a GPU is")
    parser.add_argument("--in-memory-max-mb", type=float, help="override the heads' bound (0: read from the shards)")
    args = parser.parse_args()

    config_file = Path(args.config)
    settings = WorkflowSettings(validate_config(load_workflow_config(config_file), source=str(config_file)),
                                source=str(config_file))  # fmt: skip
    task = get_task(args.task)
    set_threads(args.threads)
    heads = settings.head_settings(args.task)
    memory = (
        args.in_memory_max_mb
        if args.in_memory_max_mb is not None
        else max(h.training.in_memory_max_mb for h in heads.values())
    )
    problems = Problems(task, args.manifest, HeadRuntimeSettings(device=args.device, verify="size"), memory)
    runs = head_runs(settings, args.task, problems, args.seeds)
    problem = problems.get(runs[0].spec)

    def one_by_one():
        return [train_together(task, [run], problems.get(run.spec), problems.device, run.seed)[0] for run in runs]

    def together_by_seed():
        """As the head-training job groups them: per seed, the heads of one problem (one kind of states)."""
        together = []
        for seed in args.seeds:
            groups: dict = {}
            for run in (run for run in runs if run.seed == seed):
                groups.setdefault(id(problems.get(run.spec)), []).append(run)
            for group in groups.values():
                trained = train_together(task, group, problems.get(group[0].spec), problems.device, seed)
                together += list(zip(group, trained))
        return together

    alone = together = None
    one_by_one()  # warm-up: torch's first calls cost seconds that neither way should be charged
    seconds = {"one by one": [], "together": []}
    order = [("one by one", "together")[(i + i // 2) % 2] for i in range(2 * args.rounds)]  # ABBAAB...: against drift
    for way in order:
        t0 = time.perf_counter()
        result = one_by_one() if way == "one by one" else together_by_seed()
        seconds[way].append(time.perf_counter() - t0)
        alone, together = (result, together) if way == "one by one" else (alone, result)
    alone_s, together_s = (statistics.median(seconds[w]) for w in ("one by one", "together"))
    by_run = {(run.name, run.seed): result for run, result in together}

    same = all(
        weights(a[0]) == weights(by_run[(run.name, run.seed)][0])
        and a[1]["epoch"] == by_run[(run.name, run.seed)][1]["epoch"]
        and a[2] == by_run[(run.name, run.seed)][2]
        for run, a in zip(runs, alone)
    )
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    gpu = f", heads on {torch.cuda.get_device_name(problems.device)}" if problems.device.type == "cuda" else ""
    print(f"machine: {cpu} ({os.cpu_count()} cores){gpu}, {platform.python_version()}, torch {torch.__version__}, "
          f"{args.threads} thread(s)")  # fmt: skip
    print(f"states: {args.manifest} ({problem.n_train} training rows, shape {problem.shape})")
    print(f"runs: {len(runs)} = heads {sorted({r.name for r in runs})} x seeds {args.seeds}")
    print(f"states in memory: {problem.data_in_memory} (heads.training.in_memory_max_mb {memory:g})")
    print(f"one by one: {alone_s:.2f} s (median of {', '.join(f'{x:.2f}' for x in seconds['one by one'])})")
    print(f"together:   {together_s:.2f} s (median of {', '.join(f'{x:.2f}' for x in seconds['together'])})")
    print(f"ratio together / one by one: {together_s / alone_s:.2f}x")
    print(f"identical weights, best epochs and histories: {same}")


if __name__ == "__main__":
    run_script(main)
