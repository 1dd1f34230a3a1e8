"""The ``finetune`` stage: train the backbone with a sequence-classification head and save a
checkpoint, with BERT's own evaluation predictions and metrics, at each configured epoch
fraction. Fraction 0 is the pretrained encoder untouched (plus a freshly initialised head)."""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bertvision.config.settings import FinetuneCompute, FinetuneSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.evaluation.ensemble import save_logits
from bertvision.layout import BERT_LOGITS, BERT_METRICS, BERT_PREDICTIONS, checkpoint_dir, fraction_name, split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.tasks import TaskSpec
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.runtime.io import atomic_path, atomic_write_json, atomic_write_parquet
from bertvision.training.encoder import EncoderTrainer, EvalData, load_classifier, scored_splits, steps_per_epoch

log = logging.getLogger(__name__)


def checkpoint_steps(fractions, epoch_steps: int) -> dict[int, list[float]]:
    """Optimizer step after which each fraction's checkpoint is taken."""
    steps: dict[int, list[float]] = {}
    for frac in fractions:
        steps.setdefault(int(round(frac * epoch_steps)), []).append(frac)
    return steps


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


def finetune(
    task: TaskSpec,
    model_name: str,
    settings: FinetuneSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    raw_dir: Path,
    out_dir: Path,
    seed: int,
    threads: int | None = None,
    micro_batches: int = 1,
) -> None:
    """Fine-tune ``settings.backbone`` (the config's backbone ``model_name``) and write a
    checkpoint directory under ``out_dir`` for every configured epoch fraction.
    ``micro_batches``: split each batch into that many forward/backward passes whose
    gradients are accumulated (the effective batch, and the result, stay the same); the
    retry after a CUDA out-of-memory error raises it."""
    set_threads(threads)
    ranks, device = Ranks.from_env(pick_device(compute.device))
    backbone = settings.backbone
    fractions = sorted(settings.epoch_fractions)

    train = TokenizedSplit.read(split_file(tokens_dir, "train"))
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    model = load_classifier(task, backbone, seed).to(device)
    encoder_params = encoder_parameter_count(model)

    epoch_steps = steps_per_epoch(len(train), settings.batch_size)
    schedule_epochs = settings.schedule_epochs or max(fractions[-1], 1e-9)
    total_steps = max(1, math.ceil(schedule_epochs * epoch_steps))
    precision = resolve_precision(device, compute.precision)
    trainer = EncoderTrainer(task, model, train, settings, total_steps, device, precision, ranks, micro_batches)
    to_save = checkpoint_steps(fractions, epoch_steps)
    last_step = max(to_save)
    log.info(
        "%s on %s: %d train examples, %d steps/epoch, %d scheduled steps (warmup %d), checkpoints at steps %s, "
        "device %s (rank %d of %d), %d micro-batch(es) per batch",
        task.name,
        backbone,
        len(train),
        epoch_steps,
        total_steps,
        trainer.warmup,
        dict(sorted(to_save.items())),
        device,
        ranks.rank,
        ranks.world,
        micro_batches,
    )

    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    snapshot_seconds = 0.0  # time spent saving and evaluating, excluded from train_seconds

    def snapshot():
        nonlocal snapshot_seconds
        t0 = time.perf_counter()
        train_seconds = t0 - started - snapshot_seconds
        for frac in to_save.get(trainer.step, []) if ranks.main else []:
            ckpt = checkpoint_dir(out_dir, fraction_name(frac))
            save_checkpoint(model, ckpt)
            metrics, predictions, logits = trainer.evaluate(evals)
            atomic_write_parquet(predictions, ckpt / BERT_PREDICTIONS)
            save_logits(ckpt / BERT_LOGITS, logits)
            atomic_write_json(
                {
                    "task": task.name,
                    "model": model_name,
                    "backbone": backbone,
                    "epoch_fraction": frac,
                    "step": trainer.step,
                    "examples_seen": trainer.seen,
                    "seed": seed,
                    "metrics": metrics,
                    "train_loss_recent": trainer.recent_loss,
                    "train_seconds": train_seconds,
                    "train_padding_ratio": trainer.padding_ratio,
                    "encoder_parameters": encoder_params,
                    "device": str(device),
                    "precision": precision,
                },
                ckpt / BERT_METRICS,
            )
            log.info("checkpoint %s at step %d: %s", fraction_name(frac), trainer.step, metrics)
        ranks.barrier()  # the other ranks wait while rank 0 saves and evaluates
        snapshot_seconds += time.perf_counter() - t0

    snapshot()  # fraction 0
    progress = tqdm(total=last_step, desc="finetune", mininterval=10, unit="step")
    while trainer.step < last_step:
        for rows in trainer.batches(rng):
            trainer.train_step(rows)
            progress.update(1)
            if trainer.step in to_save:
                snapshot()
            if trainer.step >= last_step:
                break
    progress.close()
    ranks.close()
    elapsed = time.perf_counter() - started
    log.info(
        "trained %d steps, %d examples in %.1fs (%.1f ex/s incl. evaluation), padding ratio %.3f",
        trainer.step,
        trainer.seen,
        elapsed,
        trainer.seen / max(elapsed, 1e-9),
        trainer.padding_ratio or 0.0,
    )
