"""The learning-rate schedule (training/schedule.py) is transformers' linear warm-up and decay,
step for step, resumes from a checkpoint written under transformers' own, and keeps transformers
out of every job that loads no transformer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from bertvision.training.schedule import linear_warmup_then_decay
from tests.conftest import REPO


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=3e-4)


def learning_rates(scheduler, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize(("warmup", "total"), [(0, 10), (3, 10), (10, 10), (0, 1), (1, 1), (5, 7), (60, 1000)])
def test_every_step_has_transformers_rate(warmup, total):
    ours = learning_rates(linear_warmup_then_decay(optimizer(), warmup, total), total + 3)
    theirs = learning_rates(get_linear_schedule_with_warmup(optimizer(), warmup, total), total + 3)
    assert ours == theirs  # exactly: the same floats, so runs stay as they were
    assert ours[total:] == [0.0, 0.0, 0.0] and max(ours) <= 3e-4


def test_a_checkpoint_saved_under_transformers_schedule_resumes_on_ours():
    """A fine-tuning run saved in steps before the schedule moved here carries transformers'
    scheduler state (encoder_session's checkpoint); resumed, the rates go on as they would have."""
    saved = get_linear_schedule_with_warmup(optimizer(), 4, 20)
    learning_rates(saved, 7)
    resumed = linear_warmup_then_decay(optimizer(), 4, 20)
    resumed.load_state_dict(saved.state_dict())
    assert learning_rates(resumed, 13) == learning_rates(saved, 13)


def test_a_head_job_and_a_commands_help_import_no_transformers():
    """A head job on stored states loads no transformer; importing transformers' schedule cost
    each such job (a SLURM job or a job outside the warm pool) about 6 s of start-up."""
    code = """
import sys, tempfile
from pathlib import Path
from tests.test_train_head import RUNTIME, SETTINGS, planted_features
from tests.stages import with_training
from bertvision.commands.main import command_parser
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
command_parser("finetune").format_help()
root = Path(tempfile.mkdtemp())
settings = SETTINGS.replace(max_epochs=2)
train_heads(get_task("sst2"), with_training({"lp": {"type": "lp"}}, settings), RUNTIME,
            planted_features(root / "features"), [1], root / "heads", threads=1)
assert (root / "heads" / "lp" / "seed1" / "metrics.json").exists()
print(sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "peft"}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]"], out.stdout + out.stderr[-2000:]
