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
from pathlib import Path

from bertvision.config.settings import FinetuneCompute, MixtureSettings
from bertvision.files import atomic_write_json
from bertvision.layout import MIXTURE_RECORD
from bertvision.registry.tasks import get_task
from bertvision.training.encoder_session import EncoderSession, save_checkpoint

log = logging.getLogger(__name__)


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
    tasks = [get_task(t) for t in settings.tasks]
    missing = [t.name for t in tasks if t.name not in tokens_dirs]
    if missing:
        raise ValueError(f"--tokens-dirs lacks {missing}")
    session = EncoderSession(tasks, settings, compute, tokens_dirs, settings.epochs, seed, threads, micro_batches)
    session.train(session.total_steps, desc=f"finetune mixture {encoder_name}")
    record = {
        "encoder": encoder_name,
        "model": model_name,
        "epochs": settings.epochs,
        "steps": session.step,
        "train_seconds": session.train_seconds,
        "tasks": {
            name: {
                "train_rows": len(trainer.train),
                "steps": trainer.step,
                "examples_seen": trainer.seen,
                "train_loss_recent": trainer.recent_loss,
            }
            for name, trainer in session.trainers.items()
        },
        **session.record(),
    }
    if session.ranks.main:
        save_checkpoint(session.encoder, Path(out_dir))
        atomic_write_json(record, Path(out_dir) / MIXTURE_RECORD)
    session.close()
    return record
