"""The head training loop: one head, one seed, AdamW with linear warmup and decay, the epoch
kept chosen on the selection split (early stopping, best epoch restored)."""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from transformers import get_linear_schedule_with_warmup

from bertvision.config.settings import HeadTrainingSettings
from bertvision.models.heads import Standardized, build_head
from bertvision.registry.tasks import TaskSpec


def train_one(task: TaskSpec, spec: dict, settings: HeadTrainingSettings, problem, seed: int, device, moments=None,
              on_epoch=None):
    """Train one head with one seed; return it with the best epoch (by selection score) restored.
    ``moments``: (mean, std) of the training features to standardize the input with, or None.
    ``on_epoch(epoch, selection_score)`` is called after each epoch (the search prunes there)."""
    torch.manual_seed(seed)
    layers, hidden = problem.shape
    head = build_head(spec, layers, hidden, task.num_labels)
    if moments is not None:
        head = Standardized(head, *moments)
    head = head.to(device)
    max_epochs = settings.max_epochs
    batch_size = settings.batch_size
    total = max_epochs * -(-problem.n_train // batch_size)
    warmup = int(round(settings.warmup_ratio * total))
    opt = torch.optim.AdamW(head.parameters(), lr=settings.learning_rate,
                            weight_decay=settings.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, warmup, total)
    best = {"score": -np.inf, "epoch": 0, "state": copy.deepcopy(head.state_dict()), "metrics": None}
    history, wait, loop_seconds, stale = [], 0.0, 0.0, 0
    for epoch in range(1, max_epochs + 1):
        batches = problem.epoch(seed * 1000 + epoch, batch_size)
        head.train()
        t0 = time.perf_counter()
        losses = []
        for batch in batches:
            loss = problem.loss(head, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
        loop_seconds += time.perf_counter() - t0
        wait += batches.wait_seconds
        sel_metrics = problem.selection_metrics(head)
        history.append({"epoch": epoch, "train_loss": float(torch.stack(losses).mean()), "selection": sel_metrics})
        if sel_metrics[task.primary_metric] > best["score"]:
            best = {"score": sel_metrics[task.primary_metric], "epoch": epoch,
                    "state": copy.deepcopy(head.state_dict()), "metrics": sel_metrics}
            stale = 0
        else:
            stale += 1
            if stale >= settings.patience:
                break
        if on_epoch is not None:
            on_epoch(epoch, sel_metrics[task.primary_metric])
    head.load_state_dict(best["state"])
    timing = {"train_loop_seconds": loop_seconds, "data_wait_seconds": wait,
              "data_wait_share": wait / loop_seconds if loop_seconds else 0.0}
    return head, best, history, timing
