"""Heads trained one by one vs together, on one checkpoint's stored states: the seconds of each
way, their ratio, and whether every head's kept epoch, scores and weights agree (within 1e-6).

One by one: each head and seed in turn, the states read once for the job. Together, as a
head-training job trains them: every head and seed of one problem in lockstep
(``train_together``), each run in its own seed's batch order, the seeds of a head without
dropout stepping as one stacked module (``training.loop.Stack``).

    python scripts/benchmark_heads_together.py --task mrpc \\
        --manifest /tmp/default-run/features/minilm-l6/mrpc/ft1/ckpt-0/manifest.json --seeds 1 2 3
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each way, alternated")
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
    problems = Problems(task, args.manifest, HeadRuntimeSettings(device="cpu", verify="size"), memory)
    runs = head_runs(settings, args.task, problems, args.seeds)
    by_problem: dict = {}
    for run in runs:
        by_problem.setdefault(id(problems.get(run.spec)), []).append(run)

    def one_by_one():
        return {
            (run.name, run.seed): train_together(task, [run], problems.get(run.spec), problems.device, run.seed)[0]
            for run in runs
        }

    def together():
        trained = {}
        for group in by_problem.values():
            results = train_together(task, group, problems.get(group[0].spec), problems.device, [r.seed for r in group])
            trained.update({(run.name, run.seed): result for run, result in zip(group, results)})
        return trained

    one_by_one()  # warm-up: torch's first calls cost seconds that neither way should be charged
    seconds = {"one by one": [], "together": []}
    results = {}
    order = [("one by one", "together")[(i + i // 2) % 2] for i in range(2 * args.rounds)]  # ABBAAB...: against drift
    for way in order:
        t0 = time.perf_counter()
        results[way] = one_by_one() if way == "one by one" else together()
        seconds[way].append(time.perf_counter() - t0)
    alone_s, together_s = (statistics.median(seconds[w]) for w in ("one by one", "together"))

    def agree(a, b) -> bool:
        same_weights = all(
            torch.allclose(x, y, rtol=0, atol=1e-6)
            for x, y in zip(a[0].state_dict().values(), b[0].state_dict().values())
        )
        selection = [h["selection"] for h in a[2]] == [h["selection"] for h in b[2]]
        return same_weights and a[1]["epoch"] == b[1]["epoch"] and selection

    same = all(agree(results["one by one"][key], results["together"][key]) for key in results["one by one"])
    stacked = sum(timing["stack_members"] > 1 for *_, timing in results["together"].values())
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"machine: {cpu} ({os.cpu_count()} cores), {platform.python_version()}, torch {torch.__version__}, "
          f"{args.threads} thread(s)")  # fmt: skip
    problem = problems.get(runs[0].spec)
    print(f"states: {args.manifest} ({problem.n_train} training rows, shape {problem.shape})")
    print(f"runs: {len(runs)} = heads {sorted({r.name for r in runs})} x seeds {args.seeds}; {stacked} stacked")
    print(f"states in memory: {problem.data_in_memory} (heads.training.in_memory_max_mb {memory:g})")
    print(f"one by one: {alone_s:.2f} s (median of {', '.join(f'{x:.2f}' for x in seconds['one by one'])})")
    print(f"together:   {together_s:.2f} s (median of {', '.join(f'{x:.2f}' for x in seconds['together'])})")
    print(f"ratio together / one by one: {together_s / alone_s:.2f}x")
    print(f"same kept epochs and selection scores, weights within 1e-6: {same}")


if __name__ == "__main__":
    main()
