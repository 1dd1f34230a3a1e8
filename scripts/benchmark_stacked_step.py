"""The most heads of one kind trained as one batched module could save on this CPU: a training
step (forward, backward, fused AdamW) of M heads written by hand with a leading member dimension
(every member's weights in one tensor, the batch read once, one kernel per op for all members)
against the same M heads' steps one by one, at the shapes the head jobs train on.

Hand-written stacking is the best case: ``torch.func.stack_module_state`` + ``vmap`` measured
0.97x of one by one in the head jobs (docs/results/heads-stacked-mrpc.txt), because vmap and
``functional_call`` pay back in eager PyTorch the fixed costs stacking removes. If this ceiling
is far from issue 45's 0.5x, no batched module over seeds reaches it on a CPU.

    python scripts/benchmark_stacked_step.py
"""

from __future__ import annotations

import argparse
import copy
import functools
import platform
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

from bertvision.script_support import run_script


class Adapter(nn.Module):
    """An adapter head as the head jobs train it: a shared down-projection of every layer, GELU,
    learned layer weights, a linear classifier."""

    def __init__(self, layers: int, hidden: int, width: int, labels: int):
        super().__init__()
        self.down = nn.Linear(hidden, width)
        self.layer_logits = nn.Parameter(torch.zeros(layers))
        self.out = nn.Linear(width, labels)

    def forward(self, x):  # (batch, layers, hidden)
        h = F.gelu(self.down(x))
        return self.out((h * self.layer_logits.softmax(0)[:, None]).sum(1))


class StackedAdapters(nn.Module):
    """M adapters with their weights stacked on a leading member dimension."""

    def __init__(self, members: int, layers: int, hidden: int, width: int, labels: int):
        super().__init__()
        self.members = members
        self.down = nn.Parameter(torch.randn(members, hidden, width) * hidden**-0.5)
        self.down_bias = nn.Parameter(torch.zeros(members, width))
        self.layer_logits = nn.Parameter(torch.zeros(members, layers))
        self.out = nn.Parameter(torch.randn(members, width, labels) * width**-0.5)
        self.out_bias = nn.Parameter(torch.zeros(members, labels))

    def forward(self, x):  # (batch, layers, hidden) -> (members, batch, labels)
        batch, layers, hidden = x.shape
        width = self.down.shape[-1]
        down = self.down.permute(1, 0, 2).reshape(hidden, -1)  # one GEMM for every member
        h = F.gelu(x @ down + self.down_bias.reshape(-1)).reshape(batch, layers, self.members, width)
        h = (h * self.layer_logits.softmax(-1).T[None, :, :, None]).sum(1)  # (batch, members, width)
        return torch.einsum("bmw,mwc->mbc", h, self.out) + self.out_bias[:, None]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_alone(heads, optimizers, x, y):
    for head, optimizer in zip(heads, optimizers):
        loss = F.cross_entropy(head(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def vmapped(heads):
    """The generic way: any head's members stacked by ``torch.func`` and its forward ``vmap``-ed
    (what a loop stacking every head type would use), with one fused AdamW."""
    params, buffers = torch.func.stack_module_state(heads)
    template = copy.deepcopy(heads[0]).to("meta")

    def member_loss(params, buffers, x, y):
        return F.cross_entropy(torch.func.functional_call(template, (params, buffers), (x,)), y)

    losses = torch.func.vmap(member_loss, in_dims=(0, 0, None, None))
    return losses, params, buffers, torch.optim.AdamW(list(params.values()), fused=True)


def step_vmapped(losses, params, buffers, optimizer, x, y):
    loss = losses(params, buffers, x, y).sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def step_stacked(stacked, optimizer, x, y):
    logits = stacked(x)
    # the members' mean losses summed: each member's gradient is its own loss's
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.repeat(stacked.members), reduction="sum")
    optimizer.zero_grad(set_to_none=True)
    (loss / len(y)).backward()
    optimizer.step()


def seconds_per_step(step, steps: int, rounds: int, device: torch.device) -> float:
    for _ in range(20):
        step()
    times = []
    for _ in range(rounds):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[3, 6])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is")
    args = parser.parse_args()
    device = torch.device(args.device)
    # (layers, hidden): a sentence task's [CLS] states, a pair encoded apart ([u, v, |u-v|, u*v])
    shapes = {"sentence (7 x 384)": (7, 384), "pair apart (7 x 1536)": (7, 1536)}
    batch, width, labels = 32, 64, 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"machine: {where}, torch {torch.__version__}")
    print(f"adapter heads (width {width}), batch {batch}, a step = forward, backward, fused AdamW")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for shape_name, (layers, hidden) in shapes.items():
            torch.manual_seed(0)
            x = torch.randn(batch, layers, hidden, device=device)
            y = torch.randint(0, labels, (batch,), device=device)
            for members in args.members:
                heads = [Adapter(layers, hidden, width, labels).to(device) for _ in range(members)]
                optimizers = [torch.optim.AdamW(h.parameters(), fused=True) for h in heads]
                stacked = StackedAdapters(members, layers, hidden, width, labels).to(device)
                stacked_optimizer = torch.optim.AdamW(stacked.parameters(), fused=True)
                timed = functools.partial(seconds_per_step, steps=args.steps, rounds=args.rounds, device=device)
                alone = timed(functools.partial(step_alone, heads, optimizers, x, y))
                together = timed(functools.partial(step_stacked, stacked, stacked_optimizer, x, y))
                generic = timed(functools.partial(step_vmapped, *vmapped(heads), x, y))
                print(
                    f"threads {threads}, {shape_name}, {members} heads: one by one {alone * 1e3:.2f} ms, "
                    f"stacked by hand {together * 1e3:.2f} ms ({together / alone:.2f}x), "
                    f"vmap {generic * 1e3:.2f} ms ({generic / alone:.2f}x)"
                )


if __name__ == "__main__":
    run_script(main)
