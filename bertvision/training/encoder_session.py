"""One encoder-training job, as the partial fine-tuning (``stages/finetune``), the full
fine-tuning baseline (``stages/baseline``) and the task mixtures (``stages/finetune_mixture``)
run it: the set-up, the step loop and the clock they share. A single task is a mixture of one:
its model, its batches in their own order."""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertvision.config.settings import BaselineSettings, FinetuneCompute, FinetuneSettings, MixtureSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.layout import split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.runtime.io import atomic_path
from bertvision.training.encoder import EncoderTrainer, load_classifier, optimizer_step_state, steps_per_epoch

log = logging.getLogger(__name__)


def models_sharing_one_encoder(tasks, backbone: str, seed: int) -> dict[str, torch.nn.Module]:
    """Task name -> the backbone with that task's output layer, every model holding the first
    one's encoder module (so a step on any task trains the same encoder)."""
    models: dict[str, torch.nn.Module] = {}
    for task in tasks:
        model = load_classifier(task, backbone, seed)
        if models:
            setattr(model, model.base_model_prefix, next(iter(models.values())).base_model)
        models[task.name] = model
    return models


def save_checkpoint(model, out_dir: Path) -> None:
    """``model.safetensors`` + ``config.json``, each renamed into place. The model is saved into
    a scratch directory beside ``out_dir`` first; one left by a killed job is cleared here."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        model.save_pretrained(scratch, safe_serialization=True)
        for name in ("config.json", "model.safetensors"):
            with atomic_path(out_dir / name) as target:
                shutil.move(scratch / name, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class EncoderSession:
    """The threads, the device and the ranks (torchrun's), the precision; the task models over
    one encoder, their heads initialised with ``seed``; each task's training tokens and trainer,
    one AdamW with one linear warmup-decay schedule over ``schedule_epochs`` passes over all the
    training rows; the generator of the batch order (``seed``); and a clock of the training time,
    stopped while work is set aside (``aside``)."""

    def __init__(
        self,
        tasks: list[TaskSpec],
        settings: FinetuneSettings | BaselineSettings | MixtureSettings,
        compute: FinetuneCompute,
        tokens_dirs: dict[str, Path],
        schedule_epochs: float,
        seed: int,
        threads: int | None,
        micro_batches: int,
    ):
        set_threads(threads)
        self.ranks, self.device = ranks, device = Ranks.from_env(pick_device(compute.device))
        trains = {t.name: TokenizedSplit.read(split_file(tokens_dirs[t.name], "train")) for t in tasks}
        models = {n: m.to(device) for n, m in models_sharing_one_encoder(tasks, settings.backbone, seed).items()}
        self.encoder = next(iter(models.values())).base_model
        optimizer = settings.optimizer
        self.epoch_steps = sum(steps_per_epoch(len(train), optimizer.batch_size) for train in trains.values())
        self.total_steps = total = max(1, math.ceil(schedule_epochs * self.epoch_steps))
        self.precision = precision = resolve_precision(device, compute.precision, self.encoder)
        step_state = optimizer_step_state(models, optimizer, total, device, precision, ranks)
        self.trainers = {
            t.name: EncoderTrainer(
                t,
                models[t.name],
                trains[t.name],
                optimizer,
                total,
                device,
                precision,
                ranks,
                micro_batches,
                shared_step=step_state,
            )
            for t in tasks
        }
        rows = {name: len(train) for name, train in trains.items()}
        log.info(
            "%s: %s training rows, %d steps a pass, %d scheduled, device %s (rank %d of %d), "
            "%d micro-batch(es) per batch",
            settings.backbone,
            rows,
            self.epoch_steps,
            total,
            device,
            ranks.rank,
            ranks.world,
            micro_batches,
        )
        self.backbone, self.seed, self.rng, self.step = settings.backbone, seed, np.random.default_rng(seed), 0
        self.started, self.set_aside, self.aside_since = time.perf_counter(), 0.0, None

    def train(self, until: int, after_step=None, desc: str = "train") -> None:
        """Optimizer steps up to step ``until``, pass after pass over the training rows; each
        pass is every task's length-bucketed batches, several tasks' batches in one shuffled
        order. ``after_step(step)`` runs after each step."""
        progress = tqdm(total=until - self.step, desc=desc, mininterval=10, unit="step")
        while self.step < until:
            batches = [(name, rows) for name, trainer in self.trainers.items() for rows in trainer.batches(self.rng)]
            order = self.rng.permutation(len(batches)) if len(self.trainers) > 1 else range(len(batches))
            for i in order:
                name, rows = batches[i]
                self.trainers[name].train_step(rows)
                self.step += 1
                progress.update(1)
                if after_step is not None:
                    after_step(self.step)
                if self.step >= until:
                    break
        progress.close()

    @contextlib.contextmanager
    def aside(self):
        """Work kept out of the training time (saving, evaluating), done on the main rank while
        the others wait: yields whether this rank is the main one."""
        self.aside_since = time.perf_counter()
        yield self.ranks.main
        self.ranks.barrier()
        self.set_aside += time.perf_counter() - self.aside_since
        self.aside_since = None

    @property
    def train_seconds(self) -> float:
        """Seconds of training since the set-up, the work set aside not counted."""
        return (self.aside_since or time.perf_counter()) - self.started - self.set_aside

    def record(self) -> dict:
        """What every record of an encoder-training stage says about its run."""
        return {
            "backbone": self.backbone,
            "seed": self.seed,
            "encoder_parameters": encoder_parameter_count(self.encoder),
            "device": str(self.device),
            "precision": self.precision,
        }

    def close(self) -> None:
        """Leave the process group (torchrun's ranks)."""
        self.ranks.close()
        log.info("trained %d steps in %.1fs", self.step, self.train_seconds)
