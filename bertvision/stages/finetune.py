"""The ``finetune`` stage: train the backbone with its task head to one configured epoch fraction,
going on from the one before, and save that checkpoint with its training record. Fraction 0 is
the pretrained encoder untouched (plus a freshly initialised head). Scoring BERT's own head is
rule ``score_bert``'s (``stages/score_bert``): from the extraction's pass where the states are
stored, so a checkpoint is read once."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from bertvision.config.settings import FinetuneCompute, FinetuneSettings
from bertvision.files import atomic_path, atomic_write_json
from bertvision.layout import RESUME_STATE, TRAIN_RECORD, Checkpoint, checkpoint_dir
from bertvision.registry.task_spec import TaskSpec
from bertvision.training.encoder_session import EncoderSession, save_checkpoint

log = logging.getLogger(__name__)


def finetune(
    task: TaskSpec,
    model_name: str,
    settings: FinetuneSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    out_dir: Path,
    seed: int,
    checkpoint: Checkpoint,
    previous: Path | None = None,
    threads: int | None = None,
    micro_batches: int = 1,
) -> None:
    """Fine-tune ``settings.backbone`` (the config's backbone ``model_name``) from the checkpoint
    directory ``previous`` (its weights and ``RESUME_STATE``: the run's checkpoint before this one,
    which the rule names; none for the first, which starts from the pretrained encoder) to
    ``checkpoint``, and write its directory under ``out_dir``.
    One job per checkpoint, so that a race (``heads.race``) can stop the run between two; the
    schedule spans every checkpoint, and a run taken in steps equals one taken at once.
    ``micro_batches``: split each batch into that many forward/backward passes whose
    gradients are accumulated (the effective batch, and the result, stay the same); the
    retry after a CUDA out-of-memory error raises it."""
    fractions = sorted(settings.epoch_fractions)
    if checkpoint.fraction not in fractions:
        raise ValueError(f"checkpoint {checkpoint} is not one of finetune.epoch_fractions {fractions}")
    position = fractions.index(checkpoint.fraction)
    schedule = settings.schedule_epochs or max(fractions[-1], 1e-9)
    session = EncoderSession([task], settings, compute, {task.name: tokens_dir}, schedule, seed, threads, micro_batches)
    trainer = session.trainers[task.name]
    if position and previous is None:
        raise ValueError(f"checkpoint {checkpoint} follows {fractions[position - 1]}: name its directory (--previous)")
    if previous is not None:
        session.resume(load_resume_state(previous / RESUME_STATE), previous / "model.safetensors")
    step = int(round(checkpoint.fraction * session.epoch_steps))
    log.info("checkpoint %s at step %d, from step %d", checkpoint, step, session.step)
    session.train(step, desc="finetune")
    with session.aside() as main:
        if main:
            saved = checkpoint_dir(out_dir, checkpoint)
            save_checkpoint(trainer.model, saved)
            record = {
                "task": task.name,
                "model": model_name,
                "checkpoint": checkpoint.name,
                "step": session.step,
                "examples_seen": trainer.seen,
                "metrics": None,  # rule score_bert's (none at checkpoint 0: its head has not trained)
                "train_loss_recent": trainer.recent_loss,
                "train_seconds": session.train_seconds,
                "train_padding_ratio": trainer.padding_ratio,
            }
            atomic_write_json({**record, **session.record()}, saved / TRAIN_RECORD)
            save_resume_state(session.resume_state(with_optimizer=position < len(fractions) - 1), saved / RESUME_STATE)
            log.info("checkpoint %s at step %d saved", checkpoint, session.step)
    session.close()


def save_resume_state(state: dict, path: Path) -> None:
    with atomic_path(path) as target:
        torch.save(state, target)


def load_resume_state(path: Path) -> dict:
    # our own file (optimizer tensors and numpy generator states: not weights-only)
    return torch.load(path, map_location="cpu", weights_only=False)
