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
import pandas as pd
import torch
from tqdm import tqdm
from transformers import get_linear_schedule_with_warmup

from bertvision.config.settings import FinetuneCompute, FinetuneSettings
from bertvision.data.tokenized import TokenizedSplit, bucketed_batches, collate
from bertvision.evaluation.ensemble import save_logits
from bertvision.evaluation.inference import evaluate_outputs, predict, predict_span
from bertvision.layout import BERT_LOGITS, BERT_METRICS, BERT_PREDICTIONS, checkpoint_dir, fraction_name, split_file
from bertvision.models.backbone import encoder_parameter_count, resolve_pretrained
from bertvision.registry.tasks import TaskSpec
from bertvision.runtime.device import autocast, autocast_dtype, check_simulated_oom, pick_device, set_threads, to_device
from bertvision.runtime.distributed import Ranks
from bertvision.runtime.io import atomic_path, atomic_write_json, atomic_write_parquet

log = logging.getLogger(__name__)


def _model_kwargs(task: TaskSpec) -> dict:
    if task.kind == "regression":
        return {"num_labels": 1, "problem_type": "regression"}
    return {"num_labels": task.num_labels, "id2label": dict(enumerate(task.label_names)),
            "label2id": {name: i for i, name in enumerate(task.label_names)}}


# Task kind -> (Hugging Face auto class name, its from_pretrained keyword arguments).
MODEL_CLASSES = {
    "classification": ("AutoModelForSequenceClassification", _model_kwargs),
    "regression": ("AutoModelForSequenceClassification", _model_kwargs),
    "span": ("AutoModelForQuestionAnswering", lambda task: {}),
}


def load_classifier(task: TaskSpec, backbone: str, seed: int):
    """The backbone with the task kind's head (freshly initialised with ``seed``)."""
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    class_name, kwargs = MODEL_CLASSES[task.kind]
    return getattr(transformers, class_name).from_pretrained(resolve_pretrained(backbone), **kwargs(task))


def evaluate_labels(task, model, evals, questions, batch_size, device, precision, pad_id):
    metrics, tables, logits = {}, [], {}
    for name, split in evals.items():
        logits[name] = predict(model, split, batch_size, device, precision, pad_id, desc=f"evaluate {name}")
        metrics[name], table = evaluate_outputs(logits[name], split, task)
        tables.append(pd.DataFrame(table).assign(split=name))
    return metrics, pd.concat(tables, ignore_index=True), logits


def evaluate_spans(task, model, evals, questions, batch_size, device, precision, pad_id):
    from bertvision.evaluation.span_eval import evaluate_span

    logits = {name: predict_span(model, split, batch_size, device, precision, pad_id, desc=f"evaluate {name}")
              for name, split in evals.items()}
    return (*evaluate_span(task, logits, evals, questions), logits)


# Task kind -> how a checkpoint is evaluated, and on which splits (span tasks tune their null
# threshold on the selection split).
EVALUATORS = {
    "classification": (evaluate_labels, lambda task: task.eval_splits),
    "regression": (evaluate_labels, lambda task: task.eval_splits),
    "span": (evaluate_spans, lambda task: ("selection", *task.eval_splits)),
}


def build_optimizer(model, lr: float, weight_decay: float, device: torch.device):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, foreach=True, fused=False)


def checkpoint_steps(fractions, steps_per_epoch: int) -> dict[int, list[float]]:
    """Optimizer step after which each fraction's checkpoint is taken."""
    steps: dict[int, list[float]] = {}
    for frac in fractions:
        steps.setdefault(int(round(frac * steps_per_epoch)), []).append(frac)
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
    precision = compute.precision
    backbone = settings.backbone
    fractions = sorted(settings.epoch_fractions)
    batch_size = settings.batch_size

    train = TokenizedSplit.read(split_file(tokens_dir, "train"))
    evaluate, eval_splits = EVALUATORS[task.kind]
    evals = {s: TokenizedSplit.read(split_file(tokens_dir, s)) for s in eval_splits(task)}
    questions = {s: pd.read_parquet(split_file(raw_dir, s)) for s in evals}
    model = load_classifier(task, backbone, seed).to(device)
    pad_id = model.config.pad_token_id or 0
    encoder_params = encoder_parameter_count(model)

    steps_per_epoch = math.ceil(len(train) / batch_size)
    schedule_epochs = settings.schedule_epochs or max(fractions[-1], 1e-9)
    total_steps = max(1, math.ceil(schedule_epochs * steps_per_epoch))
    warmup = int(round(settings.warmup_ratio * total_steps))
    optimizer = build_optimizer(model, settings.learning_rate, settings.weight_decay, device)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total_steps)
    scaler = torch.amp.GradScaler(enabled=autocast_dtype(device, precision) == torch.float16)
    to_save = checkpoint_steps(fractions, steps_per_epoch)
    last_step = max(to_save)
    log.info(
        "%s on %s: %d train examples, %d steps/epoch, %d scheduled steps (warmup %d), checkpoints at steps %s, "
        "device %s (rank %d of %d), %d micro-batch(es) per batch",
        task.name, backbone, len(train), steps_per_epoch, total_steps, warmup, dict(sorted(to_save.items())), device,
        ranks.rank, ranks.world, micro_batches,
    )

    rng = np.random.default_rng(seed)
    step, seen, real_tokens, padded_tokens = 0, 0, 0, 0
    losses: list[float] = []
    started = time.perf_counter()
    snapshot_seconds = 0.0  # time spent saving and evaluating, excluded from train_seconds

    def snapshot():
        nonlocal snapshot_seconds
        t0 = time.perf_counter()
        train_seconds = t0 - started - snapshot_seconds
        for frac in to_save.get(step, []) if ranks.main else []:
            ckpt = checkpoint_dir(out_dir, fraction_name(frac))
            save_checkpoint(model, ckpt)
            metrics, predictions, logits = evaluate(task, model, evals, questions, settings.eval_batch_size,
                                                    device, precision, pad_id)
            atomic_write_parquet(predictions, ckpt / BERT_PREDICTIONS)
            save_logits(ckpt / BERT_LOGITS, logits)
            atomic_write_json(
                {
                    "task": task.name,
                    "model": model_name,
                    "backbone": backbone,
                    "epoch_fraction": frac,
                    "step": step,
                    "examples_seen": seen,
                    "seed": seed,
                    "metrics": metrics,
                    "train_loss_recent": float(np.mean(losses[-50:])) if losses else None,
                    "train_seconds": train_seconds,
                    "train_padding_ratio": padded_tokens / real_tokens if real_tokens else None,
                    "encoder_parameters": encoder_params,
                    "device": str(device),
                },
                ckpt / BERT_METRICS,
            )
            log.info("checkpoint %s at step %d: %s", fraction_name(frac), step, metrics)
        ranks.barrier()  # the other ranks wait while rank 0 saves and evaluates
        snapshot_seconds += time.perf_counter() - t0

    snapshot()  # fraction 0
    progress = tqdm(total=last_step, desc="finetune", mininterval=10, unit="step")
    while step < last_step:
        model.train()
        for rows in bucketed_batches(train.lengths, batch_size, rng):
            loss = 0.0
            mine = ranks.my_rows(rows)
            for part in np.array_split(mine, min(micro_batches, len(mine))) if len(mine) else []:
                check_simulated_oom(len(part))
                batch = to_device(collate(train, part, pad_id, task.kind), device)
                with autocast(device, precision):
                    part_loss = model(**batch).loss * (len(part) / len(rows))  # losses are batch means
                scaler.scale(part_loss).backward()
                loss += part_loss.detach()
                padded_tokens += int(train.lengths[part].max()) * len(part)
            ranks.sum_gradients(model)
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            seen += len(rows)
            real_tokens += int(train.lengths[rows].sum())
            losses.append(ranks.sum_scalar(float(loss)))
            progress.update(1)
            if step in to_save:
                snapshot()
            if step >= last_step:
                break
    progress.close()
    ranks.close()
    elapsed = time.perf_counter() - started
    log.info("trained %d steps, %d examples in %.1fs (%.1f ex/s incl. evaluation), padding ratio %.3f",
             step, seen, elapsed, seen / max(elapsed, 1e-9), padded_tokens / max(real_tokens, 1))

