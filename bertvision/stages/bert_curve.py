"""The ``bert_curve`` stage: BERT's own fine-tuning curve (the original BERTVision paper's
Figure 1), full fine-tuning scored at every point of ``settings.points`` epochs.

One run with the baseline's settings, its linear warmup-decay schedule spanning the last point;
at each point the model as it is then is scored on every scored split (selection and dev), the
scoring set aside from the training time. Nothing is chosen from the curve: it is a reported
figure, so scoring dev at every point leaks into no choice. The weights are not kept."""

from __future__ import annotations

import logging
from pathlib import Path

from bertvision.config.settings import CurveSettings, FinetuneCompute
from bertvision.files import atomic_write_json
from bertvision.registry.task_spec import TaskSpec, scored_splits
from bertvision.training.encoder import EvalData
from bertvision.training.encoder_session import EncoderSession

log = logging.getLogger(__name__)


def bert_curve(
    task: TaskSpec,
    model_name: str,
    settings: CurveSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    raw_dir: Path,
    out: Path,
    seed: int,
    threads: int | None = None,
    micro_batches: int = 1,
) -> None:
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    points = sorted(settings.points)
    session = EncoderSession(
        [task], settings, compute, {task.name: tokens_dir}, max(points), seed, threads, micro_batches
    )
    trainer = session.trainers[task.name]
    curve = []
    for point in points:
        session.train(int(round(point * session.epoch_steps)), desc=f"bert curve to {point:g} epochs")
        with session.aside() as main:
            if main:
                metrics = trainer.evaluate(evals, settings.optimizer.eval_batch_size)[0]
                curve.append(
                    {
                        "epochs": point,
                        "step": session.step,
                        "train_seconds": session.train_seconds,
                        "train_loss_recent": trainer.recent_loss,
                        "metrics": metrics,
                    }
                )
                log.info(
                    "%g epochs: %s %s = %.4f", point, task.eval_splits[0], task.primary_metric, task.headline(metrics)
                )
    session.close()
    if not session.ranks.main:
        return
    record = {
        "task": task.name,
        "model": model_name,
        "seed": seed,
        "points": points,
        "steps_per_epoch": session.epoch_steps,
        "curve": curve,
        "settings": settings.to_flat_dict(),
    }
    atomic_write_json({**record, **session.record()}, out)
