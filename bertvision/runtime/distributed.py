"""Data-parallel fine-tuning across the GPUs of one job, launched by ``torchrun`` (the rule
does this when it is given ``gpu`` > 1). Every rank draws the same global batch, runs its own
slice of it, and the gradients are summed across ranks before the optimizer step, so N ranks
compute the same update as one process (and the same checkpoints, up to float error). The
same code runs with the gloo backend on CPU, which is how the tests exercise it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> tuple["Ranks", torch.device]:
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
        return cls(dist.get_rank(), dist.get_world_size()), device

    def my_rows(self, rows: np.ndarray) -> np.ndarray:
        return np.array_split(rows, self.world)[self.rank]

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sum every parameter's gradient over the ranks (one flat all-reduce)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # a rank whose slice of a small batch was empty
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def sum_scalar(self, value: float) -> float:
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
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
