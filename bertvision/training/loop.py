"""The head training loop: AdamW with linear warmup and decay, the epoch kept chosen on the
selection split (early stopping, best epoch restored).

``train_together`` trains several heads and seeds in lockstep on ONE pass over the data per
epoch: each batch is drawn (read, or computed by the frozen encoder when streaming) once and
every run takes its step on it with its own optimizer. Each run keeps its own random state
(initialization, dropout), so a run trains exactly as it would alone on the same batch order;
``train_one`` is the one-run case."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from bertvision.config.settings import HeadTrainingSettings
from bertvision.models.encoder_io import checkpoint_layers
from bertvision.models.heads import build_head, core_head, standardized
from bertvision.registry.task_spec import TaskSpec
from bertvision.training.schedule import linear_warmup_then_decay


@dataclass(frozen=True)
class SeededHead:
    """One head (its spec and training settings) with one seed."""

    name: str
    spec: dict
    settings: HeadTrainingSettings
    seed: int
    moments: tuple | None = None  # (mean, std) to standardize the input with
    encoder_dir: str | None = None  # the checkpoint whose states it reads (heads with init: encoder)
    label_moments: tuple | None = None  # (mean, std) of a regression's training labels


def _rng_state(device) -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple, device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class RunState:
    """A run in training: its head, optimizer, schedule, best epoch so far and random state."""

    def __init__(self, task: TaskSpec, run: SeededHead, problem, device, steps_per_epoch: int):
        self.task, self.run, self.device = task, run, device
        torch.manual_seed(run.seed)
        layers, hidden = problem.shape
        head = build_head(run.spec, layers, hidden, task.num_labels)
        if getattr(head, "init", "random") == "encoder":
            if run.encoder_dir is None:
                raise ValueError(
                    f"head {run.name}: init encoder needs the checkpoint's weights, but its features record "
                    "no encoder directory (extracted by an older bertvision: rerun the extraction)"
                )
            head.init_from_encoder(checkpoint_layers(run.encoder_dir))
        self.head = standardized(head, run.moments, run.label_moments).to(device)
        self.fits_output = hasattr(core_head(self.head), "fit_output")  # on its first batch
        total = run.settings.max_epochs * steps_per_epoch
        # fused, as the encoder's: one kernel over every tensor instead of a dozen small ops per
        # tensor; 0.87x the step on a CPU (docs/results/heads-fused-adamw-mrpc.txt)
        self.opt = torch.optim.AdamW(
            self.head.parameters(), lr=run.settings.learning_rate, weight_decay=run.settings.weight_decay, fused=True
        )
        self.sched = linear_warmup_then_decay(self.opt, int(round(run.settings.warmup_ratio * total)), total)
        self.best = {"score": -np.inf, "epoch": 0, "state": copy.deepcopy(self.head.state_dict()), "metrics": None}
        self.history, self.stale, self.losses, self.done, self.stopped_early = [], 0, [], False, False
        self.raced_out_at: int | None = None  # the epoch a race stopped it at (training.racing)
        self.step_seconds = self.own_seconds = 0.0
        self.rng = _rng_state(device)

    def race_out(self, epoch: int) -> None:
        """Out of the race at ``epoch`` (others ranked higher): no more epochs (its best so far
        stays its result), no more seeds, and never picked; also when it had already stopped early."""
        if self.raced_out_at is None:
            self.raced_out_at, self.done = epoch, True

    def step(self, problem, batch) -> None:
        t0 = time.perf_counter()
        _set_rng_state(self.rng, self.device)
        if self.fits_output:
            problem.fit_output(self.head, batch)
            self.fits_output = False
        loss = problem.loss(self.head, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.losses.append(loss.detach())
        self.rng = _rng_state(self.device)
        self.step_seconds += time.perf_counter() - t0

    def end_epoch(self, epoch: int, problem) -> float:
        """Score the epoch on the selection split; keep it if best; stop after ``patience`` worse ones."""
        t0 = time.perf_counter()
        sel = problem.selection_metrics(self.head)
        score = sel[self.task.primary_metric]
        self.history.append({"epoch": epoch, "train_loss": float(torch.stack(self.losses).mean()), "selection": sel})
        self.losses = []
        if score > self.best["score"]:
            self.best = {"score": score, "epoch": epoch, "state": copy.deepcopy(self.head.state_dict()), "metrics": sel}
            self.stale = 0
        else:
            self.stale += 1
            self.stopped_early = self.stale >= self.run.settings.patience
        self.done = self.stopped_early or epoch >= self.run.settings.max_epochs
        self.own_seconds += time.perf_counter() - t0
        return score


class Lockstep:
    """Runs (one batch size) trained in lockstep: each epoch's batches drawn once, with seed
    ``order_seed * 1000 + epoch``, every active run taking its step on each. ``advance`` trains
    up to an epoch and can be called again to go on (a race stops runs between calls); a run's
    schedule spans its whole ``max_epochs`` either way, so pausing changes nothing."""

    def __init__(self, task: TaskSpec, runs: list[SeededHead], problem, device, order_seed: int):
        sizes = {r.settings.batch_size for r in runs}
        if len(sizes) != 1:
            raise ValueError(f"runs trained together need one batch size, got {sorted(sizes)}")
        self.batch_size, self.problem, self.order_seed = sizes.pop(), problem, order_seed
        steps = -(-problem.n_train // self.batch_size)
        self.states = [RunState(task, r, problem, device, steps) for r in runs]
        self.epoch = 0
        self.wait = self.loop_seconds = 0.0

    @property
    def max_epochs(self) -> int:
        return max(s.run.settings.max_epochs for s in self.states)

    def advance(self, until: int | None = None, on_epoch=None) -> None:
        """Train every active run up to epoch ``until`` (default: to the end). ``on_epoch(epoch,
        selection_score)`` is called after each epoch of a single run (the search prunes there)."""
        until = self.max_epochs if until is None else min(until, self.max_epochs)
        while self.epoch < until:
            active = [s for s in self.states if not s.done]
            if not active:
                return
            self.epoch += 1
            batches = self.problem.epoch(self.order_seed * 1000 + self.epoch, self.batch_size)
            for s in active:
                s.head.train()
            t0 = time.perf_counter()
            for batch in batches:
                for s in active:
                    s.step(self.problem, batch)
            self.loop_seconds += time.perf_counter() - t0
            self.wait += batches.wait_seconds
            for s in active:
                score = s.end_epoch(self.epoch, self.problem)
                if on_epoch is not None and len(self.states) == 1 and not s.stopped_early:
                    on_epoch(self.epoch, score)

    def results(self) -> list[tuple]:
        """Per run: (head with its best epoch restored, best, history, timing)."""
        results = []
        for s in self.states:
            s.head.load_state_dict(s.best["state"])
            timing = {
                "train_loop_seconds": self.loop_seconds,
                "data_wait_seconds": self.wait,
                "data_wait_share": self.wait / self.loop_seconds if self.loop_seconds else 0.0,
                "own_seconds": s.step_seconds + s.own_seconds,
            }
            results.append((s.head, s.best, s.history, timing))
        return results


def train_together(task: TaskSpec, runs: list[SeededHead], problem, device, order_seed: int, on_epoch=None):
    """Train ``runs`` (one batch size) in lockstep to their end (``Lockstep``). Returns, per run,
    (head with its best epoch restored, best, history, timing)."""
    lockstep = Lockstep(task, runs, problem, device, order_seed)
    lockstep.advance(on_epoch=on_epoch)
    return lockstep.results()


def train_one(
    task: TaskSpec,
    spec: dict,
    settings: HeadTrainingSettings,
    problem,
    seed: int,
    device,
    moments=None,
    on_epoch=None,
    encoder_dir: str | None = None,
    label_moments=None,
):
    """Train one head with one seed; return it with the best epoch (by selection score) restored.
    ``moments``: (mean, std) of the training features to standardize the input with, or None;
    ``label_moments``: (mean, std) of a regression's training labels, or None.
    ``on_epoch(epoch, selection_score)`` is called after each epoch (the search prunes there)."""
    run = SeededHead("", spec, settings, seed, moments, encoder_dir, label_moments)
    return train_together(task, [run], problem, device, seed, on_epoch)[0]
