"""A head's training step with AdamW's per-tensor loop (torch's default on a CPU) against its fused
kernel (what ``training.loop`` uses), on one checkpoint's stored states: milliseconds per step
per head type (median over interleaved rounds), their ratio, and how far the weights drift apart
after the same steps.

    python scripts/benchmark_head_steps.py --task mrpc \\
        --manifest /tmp/default-run/features/minilm-l6/mrpc/ft1/ckpt-0/manifest.json
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
from bertvision.models.heads import Standardized, build_head
from bertvision.registry.heads import is_token_head
from bertvision.registry.tasks import get_task
from bertvision.runtime.device import set_threads
from bertvision.script_support import run_script
from bertvision.training.problems import Problems


def trained(head_spec, problem, moments, task, batches, fused: bool, seed: int = 1):
    """The head after one step per batch; the seconds of the steps."""
    torch.manual_seed(seed)
    head = build_head(head_spec, *problem.shape, task.num_labels)
    head = Standardized(head, *moments) if moments is not None else head
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.01, fused=fused)
    head.train()
    t0 = time.perf_counter()
    for batch in batches:
        loss = problem.loss(head, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return head, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    settings = WorkflowSettings(validate_config(load_workflow_config(Path(args.config)), source=args.config))
    task = get_task(args.task)
    set_threads(args.threads)
    problems = Problems(task, args.manifest, HeadRuntimeSettings(device="cpu", verify="size"), 4096)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"machine: {cpu} ({os.cpu_count()} cores), {platform.python_version()}, torch {torch.__version__}, "
          f"{args.threads} thread(s)")  # fmt: skip
    print("| head | states | steps | loop ms/step | fused ms/step | fused / loop | max weight difference |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name, head in settings.head_settings(args.task).items():
        if is_token_head(head.spec):
            continue
        problem = problems.get(head.spec)
        moments = problems.moments(head.spec) if head.training.standardize else None
        batches = list(problem.epoch(1000, head.training.batch_size))
        trained(head.spec, problem, moments, task, batches, fused=True)  # warm-up
        seconds = {False: [], True: []}
        for i in range(args.rounds):
            for fused in (False, True) if i % 2 == 0 else (True, False):  # alternated: against drift
                heads = {}
                heads[fused], spent = trained(head.spec, problem, moments, task, batches, fused)
                seconds[fused].append(spent)
        loop_head, _ = trained(head.spec, problem, moments, task, batches, fused=False)
        fused_head, _ = trained(head.spec, problem, moments, task, batches, fused=True)
        drift = max((a - b).abs().max().item() for a, b in zip(loop_head.parameters(), fused_head.parameters()))
        loop_ms, fused_ms = (1000 * statistics.median(seconds[f]) / len(batches) for f in (False, True))
        ratios.append(fused_ms / loop_ms)
        print(f"| {name} | {problem.shape} | {len(batches)} | {loop_ms:.3f} | {fused_ms:.3f} | "
              f"{fused_ms / loop_ms:.2f}x | {drift:.1e} |")  # fmt: skip
    print(f"geometric mean fused / loop: {statistics.geometric_mean(ratios):.2f}x")


if __name__ == "__main__":
    run_script(main)
