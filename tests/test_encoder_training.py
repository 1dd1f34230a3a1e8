"""The encoder-training stages the fast tier otherwise reaches only through Snakemake runs: full
fine-tuning keeps the epoch best on the selection split, and a mixture fine-tunes on every task's
batches in one shuffled stream."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

import bertvision.training.encoder as encoder_training
from bertvision.registry.tasks import get_task
from bertvision.runtime.distributed import Ranks
from bertvision.stages.baseline import full_finetune
from bertvision.stages.finetune_mixture import finetune_mixture
from tests.conftest import workflow_settings
from tests.stages import download_and_tokenize


def test_full_fine_tuning_keeps_and_rescores_the_epoch_best_on_selection(tiny_bert, tmp_path):
    settings = workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={"stsb": {"train_size": 160, "eval_size": 40}},
        data={**workflow_settings().config["data"], "selection_fraction": 0.3},
        baseline={"epochs": 4, "settings": {"batch_size": 16, "learning_rate": 1e-2}},
        resources={"warm_start": False},
    )
    root = download_and_tokenize(settings, "tiny", "stsb", tmp_path)
    compute = settings.finetune_compute().replace(device="cpu", precision="fp32")
    full_finetune(get_task("stsb"), "tiny", settings.baseline("tiny", "stsb"), compute, root / "tokens",
                  root / "raw", tmp_path / "out", 1, threads=1)  # fmt: skip
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())

    history = record["history"]
    scores = [epoch["selection"]["pearson"] for epoch in history]
    assert [epoch["step"] for epoch in history] == [7, 14, 21, 28]  # 112 rows, 16 a step, every epoch
    assert len(set(scores[1:])) == 3  # the schedule spans the 4 epochs: no epoch after the first stands still
    best = scores.index(max(scores))
    assert best != len(scores) - 1, "the rows chosen here make an earlier epoch the best"
    assert record["best_epoch"] == best + 1 and record["selection_score"] == scores[best]
    assert record["metrics"]["selection"]["pearson"] == pytest.approx(scores[best], abs=1e-9)  # the kept weights
    assert record["train_seconds"] == history[best]["train_seconds"] < record["train_seconds_all_epochs"]
    assert set(record["metrics"]) == {"selection", "dev"}


@pytest.fixture(scope="module")
def mixture_data(tiny_bert, tmp_path_factory):
    settings = mixture_settings(tiny_bert, 1)
    root = tmp_path_factory.mktemp("mixture")
    return {task: download_and_tokenize(settings, "tiny", task, root / task) / "tokens" for task in ("mrpc", "stsb")}


def mixture_settings(tiny_bert, epochs: float):
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={"mrpc": {"train_size": 60, "eval_size": 16}, "stsb": {"train_size": 100, "eval_size": 16}},
        finetune={"settings": {"batch_size": 8, "learning_rate": 1e-3}},
        shared={"tasks": ["mrpc", "stsb"], "mixtures": {"mix": {"tasks": ["mrpc", "stsb"], "epochs": epochs}}},
        resources={"warm_start": False},
    )


def train_mixture(tiny_bert, tokens, epochs, out, monkeypatch) -> tuple[dict, list[str]]:
    """The mixture's record, and the task of each step in the order the steps were taken."""
    order, real_step = [], encoder_training.EncoderTrainer.train_step

    def train_step(trainer, rows):
        order.append(trainer.task.name)
        return real_step(trainer, rows)

    monkeypatch.setattr(encoder_training.EncoderTrainer, "train_step", train_step)
    settings = mixture_settings(tiny_bert, epochs)
    compute = settings.finetune_compute().replace(device="cpu", precision="fp32")
    record = finetune_mixture("mix", "tiny", settings.mixture("tiny", "mix"), compute, tokens, out, 1, threads=1)
    return record, order


def test_a_mixture_epoch_trains_every_row_of_every_task_in_one_shuffled_stream(
    tiny_bert, mixture_data, tmp_path, monkeypatch
):
    record, order = train_mixture(tiny_bert, mixture_data, 1, tmp_path, monkeypatch)
    tasks = record["tasks"]
    assert {t: tasks[t]["train_rows"] for t in tasks} == {"mrpc": 54, "stsb": 90}  # 10% to selection
    assert {t: tasks[t]["steps"] for t in tasks} == {"mrpc": 7, "stsb": 12}  # ceil(rows / 8)
    assert all(tasks[t]["examples_seen"] == tasks[t]["train_rows"] for t in tasks)
    assert record["steps"] == 19 == len(order)
    assert sum(a != b for a, b in zip(order, order[1:])) > 2, f"the tasks' batches are not mixed: {order}"


def test_a_half_epoch_mixture_takes_half_of_every_tasks_batches(tiny_bert, mixture_data, tmp_path, monkeypatch):
    record, order = train_mixture(tiny_bert, mixture_data, 0.5, tmp_path, monkeypatch)
    assert record["steps"] == math.ceil(0.5 * 19) == len(order)
    steps = {t: record["tasks"][t]["steps"] for t in record["tasks"]}
    assert 0 < steps["mrpc"] < steps["stsb"], steps  # drawn from both, about in proportion (7 : 12 batches)


def test_the_encoders_learning_rate_warms_up_over_its_share_of_the_steps_then_decays_to_zero():
    """warmup_ratio reaches the encoder's schedule (a mutant leaving it out passed every test: the
    schedule's own test builds it by hand, and the DDP tests run the same code on both sides)."""
    settings = SimpleNamespace(learning_rate=1e-3, weight_decay=0.01, warmup_ratio=0.25)
    model = {"t": torch.nn.Linear(2, 2)}
    state = encoder_training.optimizer_step_state(model, settings, 8, torch.device("cpu"), "fp32", Ranks())
    rates = []
    for _ in range(8):
        rates.append(state.optimizer.param_groups[0]["lr"])
        state.optimizer.step()
        state.scheduler.step()
    assert rates == pytest.approx([1e-3 * m for m in (0, 1 / 2, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6)])
