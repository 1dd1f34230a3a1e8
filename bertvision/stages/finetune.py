"""The ``finetune`` stage: train the backbone with a sequence-classification head and save a
checkpoint, with BERT's own evaluation predictions and metrics, at each configured epoch
fraction. Fraction 0 is the pretrained encoder untouched (plus a freshly initialised head)."""

from __future__ import annotations

import logging
from pathlib import Path

from bertvision.config.settings import FinetuneCompute, FinetuneSettings
from bertvision.evaluation.ensemble import save_logits
from bertvision.layout import BERT_LOGITS, BERT_METRICS, BERT_PREDICTIONS, Checkpoint, checkpoint_dir
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.io import atomic_write_json, atomic_write_parquet
from bertvision.training.encoder import EvalData, scored_splits
from bertvision.training.encoder_session import EncoderSession, save_checkpoint

log = logging.getLogger(__name__)


def checkpoint_steps(fractions, epoch_steps: int) -> dict[int, list[float]]:
    """Optimizer step after which each fraction's checkpoint is taken."""
    steps: dict[int, list[float]] = {}
    for frac in fractions:
        steps.setdefault(int(round(frac * epoch_steps)), []).append(frac)
    return steps


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
    fractions = sorted(settings.epoch_fractions)
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    schedule = settings.schedule_epochs or max(fractions[-1], 1e-9)
    session = EncoderSession([task], settings, compute, {task.name: tokens_dir}, schedule, seed, threads, micro_batches)
    trainer = session.trainers[task.name]
    to_save = checkpoint_steps(fractions, session.epoch_steps)
    log.info("checkpoints at steps %s", dict(sorted(to_save.items())))

    def save_checkpoints(step: int) -> None:
        if step not in to_save:
            return
        with session.aside() as main:
            for frac in to_save[step] if main else []:
                ckpt = checkpoint_dir(out_dir, Checkpoint(frac))
                save_checkpoint(trainer.model, ckpt)
                metrics, predictions, logits = trainer.evaluate(evals)
                atomic_write_parquet(predictions, ckpt / BERT_PREDICTIONS)
                save_logits(ckpt / BERT_LOGITS, logits)
                record = {
                    "task": task.name,
                    "model": model_name,
                    "epoch_fraction": frac,
                    "step": step,
                    "examples_seen": trainer.seen,
                    "metrics": metrics,
                    "train_loss_recent": trainer.recent_loss,
                    "train_seconds": session.train_seconds,
                    "train_padding_ratio": trainer.padding_ratio,
                }
                atomic_write_json({**record, **session.record()}, ckpt / BERT_METRICS)
                log.info("checkpoint %s at step %d: %s", Checkpoint(frac), step, metrics)

    save_checkpoints(0)
    session.train(max(to_save), save_checkpoints, desc="finetune")
    session.close()
