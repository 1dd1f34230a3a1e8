"""The ``baseline`` stage: full fine-tuning, the bar every BERTVision path is measured against.

The same encoder on the same training rows, trained the standard way: a linear warmup-decay
schedule over ``settings.epochs``, the model scored on the selection split after every epoch.
The epoch kept is the one with the best selection score (the dev split never takes part in
the choice); the model as it was then is scored once on every split. The record holds that
dev score and the training seconds it took to reach the kept epoch (selection scoring
excluded, as in the partial fine-tuning's ``train_seconds``). The weights are not kept: the
baseline is a reference score, not a model the workflow serves."""

from __future__ import annotations

import logging
from pathlib import Path

from bertvision.config.settings import BaselineSettings, FinetuneCompute
from bertvision.files import atomic_write_json, atomic_write_parquet
from bertvision.layout import BASELINE_METRICS, BASELINE_PREDICTIONS
from bertvision.registry.task_spec import TaskSpec, scored_splits
from bertvision.training.encoder import EvalData
from bertvision.training.encoder_session import EncoderSession

log = logging.getLogger(__name__)


def full_finetune(
    task: TaskSpec,
    model_name: str,
    settings: BaselineSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    raw_dir: Path,
    out_dir: Path,
    seed: int,
    threads: int | None = None,
    micro_batches: int = 1,
) -> None:
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    session = EncoderSession(
        [task], settings, compute, {task.name: tokens_dir}, settings.epochs, seed, threads, micro_batches
    )
    trainer = session.trainers[task.name]
    history, best, best_state = session.train_keeping_best_epoch(
        trainer, evals, settings.epochs, settings.optimizer.eval_batch_size, "baseline"
    )
    train_seconds = session.train_seconds
    session.close()
    if not session.ranks.main:
        return
    trainer.model.load_state_dict(best_state)
    metrics, predictions, _ = trainer.evaluate(evals, settings.optimizer.eval_batch_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(predictions, out_dir / BASELINE_PREDICTIONS)
    record = {
        "task": task.name,
        "model": model_name,
        "epochs": settings.epochs,
        "best_epoch": best["epoch"],
        "selection_score": best["score"],
        "metrics": metrics,
        "history": history,
        "train_seconds": best["train_seconds"],  # to reach the kept epoch
        "train_seconds_all_epochs": train_seconds,
        "examples_per_epoch": len(trainer.train),
        "settings": settings.to_flat_dict(),
    }
    atomic_write_json({**record, **session.record()}, out_dir / BASELINE_METRICS)
    log.info(
        "%s: kept epoch %d of %d (selection %.4f); eval %s",
        task.name,
        best["epoch"],
        settings.epochs,
        best["score"],
        {s: metrics[s] for s in task.eval_splits},
    )
