"""Training the whole encoder with its task head: the model, AdamW with a linear warm-up and
decay (``training.schedule``), one optimizer step per length-bucketed batch (micro-batches, data-parallel
ranks under DistributedDataParallel, gradient clipping, fp16 scaling), and BERT's own
evaluation. ``training/encoder_session`` sets them up for the stages that train an encoder."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertvision.config.settings import OptimizerSettings
from bertvision.data.tokenized import TokenizedSplit, bucketed_batches, collate
from bertvision.evaluation.inference import evaluate_outputs, predict, predict_span
from bertvision.layout import split_file
from bertvision.models.backbone import load_pretrained
from bertvision.models.encoder_io import TASK_MODEL_CLASSES, pad_id
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.device import autocast, autocast_dtype, check_simulated_oom, to_device
from bertvision.runtime.distributed import Ranks, accumulating
from bertvision.training.schedule import linear_warmup_then_decay


def _model_kwargs(task: TaskSpec) -> dict:
    if task.kind == "regression":
        return {"num_labels": 1, "problem_type": "regression"}
    return {
        "num_labels": task.num_labels,
        "id2label": dict(enumerate(task.label_names)),
        "label2id": {name: i for i, name in enumerate(task.label_names)},
    }


# Task kind -> the from_pretrained keyword arguments of its fresh head (TASK_MODEL_CLASSES: the class).
HEAD_KWARGS = {"classification": _model_kwargs, "regression": _model_kwargs, "span": lambda task: {}}


def span_loss(out, batch: dict) -> torch.Tensor:
    """The batch's mean of (start + end cross-entropy) / 2, each a softmax over the window's real
    tokens only. Transformers' own QA loss takes the softmax over the padded positions too, so a
    window's loss would depend on the longest window batched with it, and micro-batches (the
    out-of-memory retry) would change the update."""
    padding = batch["attention_mask"] == 0
    lowest = torch.finfo(torch.float32).min

    def cross_entropy(logits, positions):
        return torch.nn.functional.cross_entropy(logits.float().masked_fill(padding, lowest), positions)

    return (
        cross_entropy(out.start_logits, batch["start_positions"])
        + cross_entropy(out.end_logits, batch["end_positions"])
    ) / 2


# Labels the span loss reads from the batch instead of the model (``batch_loss``).
SPAN_LABELS = ("start_positions", "end_positions")


def batch_loss(task: TaskSpec, net, batch: dict) -> torch.Tensor:
    """The mean loss of a collated batch (labels included): the model's own for example tasks
    (per example, independent of padding), ``span_loss`` for span tasks."""
    if task.kind != "span":
        return net(task.name, **batch).loss
    return span_loss(net(task.name, **{k: v for k, v in batch.items() if k not in SPAN_LABELS}), batch)


def load_classifier(task: TaskSpec, backbone: str, seed: int):
    """The backbone with the task kind's head (freshly initialised with ``seed``)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    return load_pretrained(TASK_MODEL_CLASSES[task.kind], backbone, **HEAD_KWARGS[task.kind](task))


def score_labels(task, logits, splits, questions):
    """(metrics per split, predictions table) of an example task's model outputs ``logits``
    (split -> (N, C)) on ``splits`` (split -> TokenizedSplit)."""
    metrics, tables = {}, []
    for name, split in splits.items():
        metrics[name], table = evaluate_outputs(logits[name], split, task, questions.get(name))
        tables.append(pd.DataFrame(table).assign(split=name))
    return metrics, pd.concat(tables, ignore_index=True)


def score_spans(task, logits, splits, questions):
    """(metrics per split, predictions table) of a span task's start/end logits (split -> one
    (T, 2) array per window); the null threshold is tuned on the selection split."""
    from bertvision.evaluation.span_eval import evaluate_span

    return evaluate_span(task, logits, splits, questions)


# Task kind -> how a model's outputs on a dict of splits are scored.
SCORERS = {"classification": score_labels, "regression": score_labels, "span": score_spans}


def evaluate_labels(task, model, evals, questions, batch_size, device, precision, pad_id):
    logits = {
        name: predict(model, split, batch_size, device, precision, pad_id, desc=f"evaluate {name}")
        for name, split in evals.items()
    }
    return (*score_labels(task, logits, evals, questions), logits)


def evaluate_spans(task, model, evals, questions, batch_size, device, precision, pad_id):
    logits = {
        name: predict_span(model, split, batch_size, device, precision, pad_id, desc=f"evaluate {name}")
        for name, split in evals.items()
    }
    return (*score_spans(task, logits, evals, questions), logits)


# Task kind -> how the model is evaluated on a dict of splits: (metrics per split, predictions
# table, logits per split). Span tasks tune their null threshold on the "selection" split,
# which every evaluation includes.
EVALUATORS = {
    "classification": evaluate_labels,
    "regression": evaluate_labels,
    "span": evaluate_spans,
}


@dataclass
class EvalData:
    """The tokenized splits a model is scored on, with their raw rows (span decoding)."""

    splits: dict[str, TokenizedSplit]
    questions: dict[str, pd.DataFrame]

    @classmethod
    def read(cls, tokens_dir: Path, raw_dir: Path, splits) -> EvalData:
        return cls(
            {s: TokenizedSplit.read(split_file(tokens_dir, s)) for s in splits},
            {s: pd.read_parquet(split_file(raw_dir, s)) for s in splits},
        )

    def only(self, *names: str) -> EvalData:
        return EvalData({s: self.splits[s] for s in names}, {s: self.questions[s] for s in names})


def steps_per_epoch(n_rows: int, batch_size: int) -> int:
    return math.ceil(n_rows / batch_size)


def build_optimizer(model, lr: float, weight_decay: float):
    """AdamW without weight decay on biases and on the parameters of LayerNorm modules (found
    by type, as the architectures name them differently: BERT's LayerNorm, DistilBERT's
    sa_layer_norm)."""
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    decayed = {name for name in get_parameter_names(model, ALL_LAYERNORM_LAYERS) if not name.endswith("bias")}
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (decay if name in decayed else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, fused=True)


class TaskModels(torch.nn.Module):
    """Task models over one encoder (or a single one) as one module, the module an optimizer
    step works on: ``forward(task, **batch)`` runs that task's model. Shared parameters appear
    once in ``parameters()``."""

    def __init__(self, models: dict[str, torch.nn.Module]):
        super().__init__()
        self.index = {name: i for i, name in enumerate(models)}
        self.models = torch.nn.ModuleList(models.values())

    def forward(self, task: str, **batch):
        return self.models[self.index[task]](**batch)


@dataclass
class StepState:
    """What the optimizer steps of one or several task models over one encoder work on:
    ``net``, the models as one ``TaskModels`` (in DistributedDataParallel with several ranks),
    AdamW over their parameters, the linear warmup-decay schedule and the fp16 loss scaler."""

    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler


def optimizer_step_state(
    models: dict[str, torch.nn.Module],
    settings: OptimizerSettings,
    total_steps: int,
    device,
    precision: str,
    ranks: Ranks,
) -> StepState:
    """The step state of ``models`` (task name -> model): AdamW, the linear
    warm-up and decay schedule over ``total_steps`` and the fp16 loss scaler (inactive in other
    precisions). Several models (a mixture): a step trains one task's output layer, so DDP
    looks for the parameters a step leaves unused."""
    union = TaskModels(models)
    optimizer = build_optimizer(union, settings.learning_rate, settings.weight_decay)
    warmup = int(round(settings.warmup_ratio * total_steps))
    scheduler = linear_warmup_then_decay(optimizer, warmup, total_steps)
    scaler = torch.amp.GradScaler(enabled=autocast_dtype(device, precision) == torch.float16)
    return StepState(ranks.wrap(union, find_unused_parameters=len(models) > 1), optimizer, scheduler, scaler)


@dataclass
class EncoderTrainer:
    """One model's optimizer state and step counters over a training split. ``model`` stays the
    plain model (saved and evaluated as it is); the steps run through ``net``
    (``StepState.net``)."""

    task: TaskSpec
    model: torch.nn.Module
    train: TokenizedSplit
    settings: OptimizerSettings
    total_steps: int
    device: torch.device
    precision: str
    ranks: Ranks
    micro_batches: int = 1
    step: int = 0
    seen: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    losses: list = field(default_factory=list)
    # the step state of several models that share an encoder (a task mixture); None: this
    # model's own
    shared_step: StepState | None = None

    def __post_init__(self):
        self.pad_id = pad_id(self.model)
        self.warmup = int(round(self.settings.warmup_ratio * self.total_steps))
        if self.shared_step is None:
            self.shared_step = optimizer_step_state(
                {self.task.name: self.model}, self.settings, self.total_steps, self.device, self.precision, self.ranks
            )
        self.net = self.shared_step.net
        self.optimizer, self.scheduler, self.scaler = (
            self.shared_step.optimizer,
            self.shared_step.scheduler,
            self.shared_step.scaler,
        )

    def batches(self, rng: np.random.Generator):
        """One epoch of length-bucketed batches (row indices)."""
        return bucketed_batches(self.train.lengths, self.settings.batch_size, rng)

    def train_step(self, rows: np.ndarray) -> None:
        """One optimizer step on the batch ``rows``: this rank's slice of it, in micro-batches
        whose gradients accumulate on the rank, the last one's backward pass all-reducing them.
        A part's loss is weighted by its share of the batch (losses are batch means), times
        the world size, as DDP averages over the ranks: the result is the gradient of the
        batch's mean loss. Every rank must take part in the all-reduce: a rank whose slice of a
        small batch is empty runs the batch's first row with weight 0."""
        self.net.train()
        loss = 0.0
        mine = self.ranks.my_rows(rows)
        parts = (
            [(part, len(part) / len(rows)) for part in np.array_split(mine, min(self.micro_batches, len(mine)))]
            if len(mine)
            else [(rows[:1], 0.0)]
        )
        for i, (part, weight) in enumerate(parts):
            with contextlib.nullcontext() if i == len(parts) - 1 else accumulating(self.net):
                check_simulated_oom(len(part))
                batch = to_device(collate(self.train, part, self.pad_id, self.task.kind), self.device)
                with autocast(self.device, self.precision):
                    part_loss = batch_loss(self.task, self.net, batch) * weight
                self.scaler.scale(part_loss * self.ranks.world).backward()
            loss += part_loss.detach()
            self.padded_tokens += int(self.train.lengths[part].max()) * len(part) if weight else 0
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.seen += len(rows)
        self.real_tokens += int(self.train.lengths[rows].sum())
        self.losses.append(self.ranks.sum_scalar(float(loss)))

    @property
    def recent_loss(self) -> float | None:
        return float(np.mean(self.losses[-50:])) if self.losses else None

    @property
    def padding_ratio(self) -> float | None:
        return self.padded_tokens / self.real_tokens if self.real_tokens else None

    def evaluate(self, data: EvalData, batch_size: int):
        """(metrics per split, predictions table, logits per split) of the model as it is now, run
        ``batch_size`` examples per forward pass."""
        return EVALUATORS[self.task.kind](
            self.task,
            self.model,
            data.splits,
            data.questions,
            batch_size,
            self.device,
            self.precision,
            self.pad_id,
        )
