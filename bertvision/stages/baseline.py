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
import time
from pathlib import Path

import numpy as np

from bertvision.config.settings import BaselineSettings, FinetuneCompute
from bertvision.data.tokenized import TokenizedSplit
from bertvision.layout import BASELINE_METRICS, BASELINE_PREDICTIONS, split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.tasks import TaskSpec
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.runtime.io import atomic_write_json, atomic_write_parquet
from bertvision.training.encoder import EncoderTrainer, EvalData, load_classifier, scored_splits, steps_per_epoch

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
    set_threads(threads)
    ranks, device = Ranks.from_env(pick_device(compute.device))
    train = TokenizedSplit.read(split_file(tokens_dir, "train"))
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    selection = evals.only("selection")
    model = load_classifier(task, settings.backbone, seed).to(device)
    epoch_steps = steps_per_epoch(len(train), settings.batch_size)
    precision = resolve_precision(device, compute.precision)
    trainer = EncoderTrainer(
        task, model, train, settings, settings.epochs * epoch_steps, device, precision, ranks, micro_batches
    )
    log.info(
        "%s on %s: full fine-tuning, %d train examples, %d epochs of %d steps (warmup %d), device %s",
        task.name,
        settings.backbone,
        len(train),
        settings.epochs,
        epoch_steps,
        trainer.warmup,
        device,
    )

    rng = np.random.default_rng(seed)
    history, best, best_state = [], None, None
    train_seconds = 0.0
    for epoch in range(1, settings.epochs + 1):
        t0 = time.perf_counter()
        for rows in trainer.batches(rng):
            trainer.train_step(rows)
        train_seconds += time.perf_counter() - t0
        if ranks.main:
            metrics = trainer.evaluate(selection)[0]["selection"]
            score = float(metrics[task.primary_metric])
            history.append(
                {
                    "epoch": epoch,
                    "step": trainer.step,
                    "train_seconds": train_seconds,
                    "train_loss_recent": trainer.recent_loss,
                    "selection": metrics,
                }
            )
            log.info("epoch %d: selection %s = %.4f", epoch, task.primary_metric, score)
            if best is None or score > best["score"]:
                best = {"epoch": epoch, "score": score, "train_seconds": train_seconds}
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        ranks.barrier()
    ranks.close()
    if not ranks.main:
        return
    model.load_state_dict(best_state)
    metrics, predictions, _ = trainer.evaluate(evals)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(predictions, out_dir / BASELINE_PREDICTIONS)
    atomic_write_json(
        {
            "task": task.name,
            "model": model_name,
            "backbone": settings.backbone,
            "seed": seed,
            "epochs": settings.epochs,
            "best_epoch": best["epoch"],
            "selection_score": best["score"],
            "metrics": metrics,
            "history": history,
            "train_seconds": best["train_seconds"],  # to reach the kept epoch
            "train_seconds_all_epochs": train_seconds,
            "examples_per_epoch": len(train),
            "encoder_parameters": encoder_parameter_count(model),
            "settings": settings.to_dict(),
            "device": str(device),
            "precision": precision,
        },
        out_dir / BASELINE_METRICS,
    )
    log.info(
        "%s: kept epoch %d of %d (selection %.4f); eval %s",
        task.name,
        best["epoch"],
        settings.epochs,
        best["score"],
        {s: metrics[s] for s in task.eval_splits},
    )
