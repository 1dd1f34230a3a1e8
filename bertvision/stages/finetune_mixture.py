"""The ``finetune_mixture`` stage: one encoder fine-tuned on several tasks at once, a shared
encoder of the ``shared`` section. Each task keeps its own output layer (the model class of its
kind) over the one encoder; every optimizer step is a batch of one task, the batches of all the
tasks shuffled together, so each task is seen in proportion to its training rows. One AdamW
and one linear warmup-decay schedule cover all the parameters; with several ranks, one
DistributedDataParallel covers them too, told that a step leaves the other tasks' output
layers unused. Only the encoder is saved: the heads that serve the tasks are trained on its
states afterwards."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertvision.config.settings import FinetuneCompute, MixtureSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.layout import MIXTURE_RECORD, split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.tasks import get_task
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.runtime.io import atomic_write_json
from bertvision.stages.finetune import save_checkpoint
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


def mixed_batches(trainers: dict[str, EncoderTrainer], rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """One pass over every task's training rows: each task's length-bucketed batches, all the
    tasks' batches in one shuffled order."""
    batches = [(name, rows) for name, trainer in trainers.items() for rows in trainer.batches(rng)]
    return [batches[i] for i in rng.permutation(len(batches))]


def finetune_mixture(
    encoder_name: str,
    model_name: str,
    settings: MixtureSettings,
    compute: FinetuneCompute,
    tokens_dirs: dict[str, Path],
    out_dir: Path,
    seed: int,
    threads: int | None = None,
    micro_batches: int = 1,
) -> dict:
    """Fine-tune ``settings.backbone`` on the training rows of ``settings.tasks`` (tokens in
    ``tokens_dirs[task]``) for ``settings.epochs`` passes; save the encoder (safetensors and
    config) and a training record into ``out_dir``."""
    set_threads(threads)
    ranks, device = Ranks.from_env(pick_device(compute.device))
    tasks = [get_task(t) for t in settings.tasks]
    missing = [t.name for t in tasks if t.name not in tokens_dirs]
    if missing:
        raise ValueError(f"--tokens-dirs lacks {missing}")
    models = {
        name: model.to(device) for name, model in models_sharing_one_encoder(tasks, settings.backbone, seed).items()
    }
    trains = {t.name: TokenizedSplit.read(split_file(tokens_dirs[t.name], "train")) for t in tasks}
    epoch_steps = sum(steps_per_epoch(len(train), settings.batch_size) for train in trains.values())
    total_steps = max(1, math.ceil(settings.epochs * epoch_steps))
    # one AdamW over every model (shared parameters once); with several ranks, one DDP over them
    precision = resolve_precision(device, compute.precision)
    step_state = optimizer_step_state(models, settings, total_steps, device, precision, ranks)
    trainers = {
        t.name: EncoderTrainer(
            t,
            models[t.name],
            trains[t.name],
            settings,
            total_steps,
            device,
            precision,
            ranks,
            micro_batches,
            shared_step=step_state,
        )
        for t in tasks
    }
    log.info(
        "mixture %s on %s: %s training rows, %d steps per pass, %d steps, device %s (rank %d of %d)",
        encoder_name,
        settings.backbone,
        {n: len(t) for n, t in trains.items()},
        epoch_steps,
        total_steps,
        device,
        ranks.rank,
        ranks.world,
    )

    rng = np.random.default_rng(seed)
    started, step = time.perf_counter(), 0
    progress = tqdm(total=total_steps, desc="finetune mixture", mininterval=10, unit="step")
    while step < total_steps:
        for name, rows in mixed_batches(trainers, rng):
            trainers[name].train_step(rows)
            step += 1
            progress.update(1)
            if step >= total_steps:
                break
    progress.close()
    train_seconds = time.perf_counter() - started
    encoder = next(iter(models.values())).base_model
    record = {
        "encoder": encoder_name,
        "model": model_name,
        "backbone": settings.backbone,
        "seed": seed,
        "epochs": settings.epochs,
        "steps": step,
        "train_seconds": train_seconds,
        "encoder_parameters": encoder_parameter_count(encoder),
        "device": str(device),
        "precision": precision,
        "tasks": {
            name: {
                "train_rows": len(trains[name]),
                "steps": t.step,
                "examples_seen": t.seen,
                "train_loss_recent": t.recent_loss,
            }
            for name, t in trainers.items()
        },
    }
    if ranks.main:
        save_checkpoint(encoder, Path(out_dir))
        atomic_write_json(record, Path(out_dir) / MIXTURE_RECORD)
    ranks.close()
    log.info("trained %d steps in %.1fs: %s", step, train_seconds, record["tasks"])
    return record
