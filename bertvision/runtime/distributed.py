"""Data-parallel fine-tuning across the GPUs of one job, launched by ``torchrun`` (the rule
does this when it is given ``gpu`` > 1). Every rank draws the same global batch and runs its own
slice of it through the model wrapped in torch's ``DistributedDataParallel`` (``Ranks.wrap``),
whose backward pass all-reduces the gradients in buckets while it runs; the micro-batches
before a batch's last one accumulate locally (``accumulating``). DDP averages the ranks'
gradients, so each rank scales its loss by the world size (``EncoderTrainer.train_step``): the
average is then the gradient of the global batch's mean loss, and N ranks compute the same
update as one process (and the same checkpoints, up to float error). NCCL on GPUs; the same
code runs with the gloo backend on CPU, which is how the tests exercise it."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Ranks:
    """Which rank this process is, of how many, and the device its collectives run on."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> tuple[Ranks, torch.device]:
        """Join the process group that torchrun set up (WORLD_SIZE > 1); return the ranks and
        this rank's device."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(), device
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), device), device

    def my_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.array_split(rows, self.world)[self.rank]

    def wrap(self, module: torch.nn.Module, find_unused_parameters: bool = False) -> torch.nn.Module:
        """``module`` itself with one rank; with several, ``module`` in DistributedDataParallel
        (on this rank's GPU, if it has one), whose backward pass averages every gradient over
        the ranks. ``find_unused_parameters``: some parameters get no gradient in a step (the
        other tasks' output layers in a task mixture); DDP then leaves the gradients of those
        no rank used untouched (None), as one process would. Buffers are broadcast once, not
        before every forward pass: the encoders' are constants, and the ranks may run different
        numbers of micro-batches (a broadcast in each would leave collectives unmatched)."""
        if self.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(
            module,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=find_unused_parameters,
        )
        net.broadcast_buffers = False  # (the constructor's argument of that name is deprecated in torch 2.13)
        return net

    def sum_scalar(self, value: float) -> float:
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)  # NCCL: a GPU tensor
        dist.all_reduce(t)
        return float(t)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def accumulating(net: torch.nn.Module):
    """A context in which backward passes only accumulate gradients on this rank (DDP's
    ``no_sync``): the micro-batches of a batch before its last, whose backward pass then
    all-reduces the sum."""
    from torch.nn.parallel import DistributedDataParallel

    return net.no_sync() if isinstance(net, DistributedDataParallel) else contextlib.nullcontext()
