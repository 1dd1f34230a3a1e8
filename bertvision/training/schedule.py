"""The learning-rate schedule of every training loop: a linear warm-up to the peak rate, then a
linear decay to zero at the last step.

Written here rather than imported as transformers' ``get_linear_schedule_with_warmup`` (the same
multipliers, step for step: tests/test_schedule.py): importing that pulls in transformers'
trainer utilities and costs a job about 6 s of start-up on a 2-core CPU, and a head job, a search
worker or a command's ``--help`` never loads a transformer otherwise."""

from __future__ import annotations

from functools import partial

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _multiplier(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def linear_warmup_then_decay(optimizer: Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    # a partial, not a closure: LambdaLR's state_dict keeps a callable object's state, so a
    # checkpoint's scheduler state has the shape it had under transformers' function
    return LambdaLR(optimizer, partial(_multiplier, warmup_steps=warmup_steps, total_steps=total_steps))
