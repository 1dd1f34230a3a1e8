"""The head training loop: AdamW with linear warmup and decay, the epoch kept chosen on the
selection split (early stopping, best epoch restored).

``train_together`` trains several heads and seeds in lockstep on ONE pass over the data per
epoch: each batch order's batches are drawn (read, or computed by the frozen encoder when
streaming) once and every run takes its step on its own order's batch with its own optimizer.
Each run keeps its own random state (initialization, dropout), so a run trains as it would
alone on the same batch order; ``train_one`` is the one-run case.

Runs of one head spec and training settings that differ only in seed (and in batch order) train
as one module (``Stack``) where their step draws no random numbers (no dropout at work) and the
problem's batches have one shape: their parameters stacked, the forward ``vmap``-ed over the
members, one AdamW. AdamW and the linear schedule work element by element, and the summed loss
gives each member its own loss's gradient, so a member trains as it would alone (to float
rounding: tests/test_stacked_heads.py); one step for all members instead of one per member is
what it saves, because a small head's step costs its fixed overhead (the Python, the autograd
graph, the optimizer's loop), not its arithmetic."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from bertvision.config.settings import HeadTrainingSettings
from bertvision.models.encoder_io import checkpoint_layers
from bertvision.models.heads import Standardized, build_head
from bertvision.registry.task_spec import TaskSpec


@dataclass(frozen=True)
class SeededHead:
    """One head (its spec and training settings) with one seed."""

    name: str
    spec: dict
    settings: HeadTrainingSettings
    seed: int
    moments: tuple | None = None  # (mean, std) to standardize the input with
    encoder_dir: str | None = None  # the checkpoint whose states it reads (heads with init: encoder)


def _rng_state(device) -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state: tuple, device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _schedule(optimizer, settings: HeadTrainingSettings, steps_per_epoch: int):
    total = settings.max_epochs * steps_per_epoch
    return get_linear_schedule_with_warmup(optimizer, int(round(settings.warmup_ratio * total)), total)


class RunState:
    """A run in training: its head, optimizer, schedule, best epoch so far and random state.
    ``order_seed``: its batches' order (the run's seed, or the first seed's when they share a
    stream); ``stacked``: it steps as a member of a ``Stack``."""

    def __init__(self, task: TaskSpec, run: SeededHead, problem, device, steps_per_epoch: int, order_seed: int):
        self.task, self.run, self.device, self.order_seed = task, run, device, order_seed
        self.stacked = False
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
        if run.moments is not None:
            head = Standardized(head, *run.moments)
        self.head = head.to(device)
        self.opt = torch.optim.AdamW(
            self.head.parameters(), lr=run.settings.learning_rate, weight_decay=run.settings.weight_decay
        )
        self.sched = _schedule(self.opt, run.settings, steps_per_epoch)
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


def _draws_random_numbers(head: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in head.modules())


class Stack:
    """Runs of one head spec and training settings, each with its own seed and batch order,
    stepped as one module: parameters stacked (``torch.func.stack_module_state``), each member's
    loss on its own batch by a ``vmap``-ed functional call, one AdamW over the stacked tensors.
    A member that has finished keeps stepping with the others (its result, its best epoch, is
    already kept); ``sync`` copies each member's slice back into its own head for scoring."""

    def __init__(self, states: list[RunState], problem, steps_per_epoch: int):
        self.states, self.problem, self.steps_per_epoch = states, problem, steps_per_epoch
        self.all_states, self.members = list(states), len(states)
        for state in states:
            state.stacked = True
        params, self.buffers = torch.func.stack_module_state([state.head for state in states])
        self.opt, self.sched = self._optimizer(params)
        template = copy.deepcopy(states[0].head).to("meta")

        def member_loss(params, buffers, *batch):
            return problem.loss(lambda *x: torch.func.functional_call(template, (params, buffers), x), batch)

        self.losses = torch.func.vmap(member_loss)

    def _optimizer(self, params: dict):
        self.params = params
        settings = self.states[0].run.settings
        opt = torch.optim.AdamW(list(params.values()), lr=settings.learning_rate, weight_decay=settings.weight_decay)
        return opt, _schedule(opt, settings, self.steps_per_epoch)

    @property
    def active(self) -> bool:
        return any(not state.done for state in self.states)

    def drop_finished(self) -> None:
        """Go on with the members still training only: their slices of the parameters, buffers
        and AdamW's moments, and the schedule where it stands (the members step together, so they
        share its step). Finished members would otherwise step to the last one's end."""
        keep = [i for i, state in enumerate(self.states) if not state.done]
        if len(keep) == len(self.states) or not keep:
            return
        rows = torch.tensor(keep)
        old_params, old_opt, old_sched = self.params, self.opt, self.sched
        params = {name: p.detach()[rows].clone().requires_grad_() for name, p in old_params.items()}
        self.buffers = {name: b[rows].clone() for name, b in self.buffers.items()}
        self.opt, self.sched = self._optimizer(params)
        for name, param in params.items():
            moments = old_opt.state.get(old_params[name])
            if moments:
                self.opt.state[param] = {k: v if k == "step" else v[rows].clone() for k, v in moments.items()}
        self.sched.load_state_dict(old_sched.state_dict())
        for group, old_group in zip(self.opt.param_groups, old_opt.param_groups, strict=True):
            group["lr"] = old_group["lr"]
        self.states = [self.states[i] for i in keep]

    def step(self, batches: list[tuple]) -> None:
        """One step of every member, each on its own batch (one per member, in order)."""
        t0 = time.perf_counter()
        stacked = [torch.stack(parts).to(self.states[0].device, non_blocking=True) for parts in zip(*batches)]
        losses = self.losses(self.params, self.buffers, *stacked)
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        self.opt.step()
        self.sched.step()
        for state, loss in zip(self.states, losses.detach()):
            state.losses.append(loss)
        share = (time.perf_counter() - t0) / len(self.states)
        for state in self.states:
            state.step_seconds += share

    def sync(self) -> None:
        with torch.no_grad():
            for i, state in enumerate(self.states):
                for name, param in state.head.named_parameters():
                    param.copy_(self.params[name][i])


def _stacks(states: list[RunState], problem, steps_per_epoch: int) -> list[Stack]:
    """The runs that step as one module: two or more of one head spec and training settings (and
    so one architecture and shape), where the problem's batches stack and no dropout is at work."""
    if not getattr(problem, "stackable", False):
        return []
    members: dict = {}
    for state in states:
        if not _draws_random_numbers(state.head):
            key = (repr(state.run.spec), repr(state.run.settings))
            members.setdefault(key, []).append(state)
    return [Stack(group, problem, steps_per_epoch) for group in members.values() if len(group) > 1]


class Lockstep:
    """Runs (one batch size) trained in lockstep: each epoch's batches drawn once per batch order
    (``order_seeds``: one per run, or one for all), with seed ``order_seed * 1000 + epoch``, every
    active run taking its step on its order's batch; runs of one spec step as one ``Stack``.
    ``advance`` trains up to an epoch and can be called again to go on (a race stops runs between
    calls); a run's schedule spans its whole ``max_epochs`` either way, so pausing changes nothing."""

    def __init__(self, task: TaskSpec, runs: list[SeededHead], problem, device, order_seeds: int | list[int]):
        sizes = {r.settings.batch_size for r in runs}
        if len(sizes) != 1:
            raise ValueError(f"runs trained together need one batch size, got {sorted(sizes)}")
        self.batch_size, self.problem = sizes.pop(), problem
        orders = order_seeds if isinstance(order_seeds, list) else [order_seeds] * len(runs)
        steps = -(-problem.n_train // self.batch_size)
        self.states = [RunState(task, r, problem, device, steps, order) for r, order in zip(runs, orders)]
        self.stacks = _stacks(self.states, problem, steps)
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
            stacks = [stack for stack in self.stacks if stack.active]
            for stack in stacks:
                stack.drop_finished()
            alone = [s for s in active if not s.stacked]
            stepping = alone + [s for stack in stacks for s in stack.states]
            orders = list(dict.fromkeys(s.order_seed for s in stepping))
            epochs = [self.problem.epoch(order * 1000 + self.epoch, self.batch_size) for order in orders]
            for s in stepping:
                s.head.train()
            t0 = time.perf_counter()
            for batches in zip(*epochs):
                batch_of = dict(zip(orders, batches))
                for s in alone:
                    s.step(self.problem, batch_of[s.order_seed])
                for stack in stacks:
                    stack.step([batch_of[s.order_seed] for s in stack.states])
            self.loop_seconds += time.perf_counter() - t0
            self.wait += sum(batches.wait_seconds for batches in epochs)
            for stack in stacks:
                stack.sync()
            for s in active:
                score = s.end_epoch(self.epoch, self.problem)
                if on_epoch is not None and len(self.states) == 1 and not s.stopped_early:
                    on_epoch(self.epoch, score)

    def results(self) -> list[tuple]:
        """Per run: (head with its best epoch restored, best, history, timing)."""
        results = []
        stacked_with = {id(s): stack.members for stack in self.stacks for s in stack.all_states}
        for s in self.states:
            s.head.load_state_dict(s.best["state"])
            timing = {
                "train_loop_seconds": self.loop_seconds,
                "data_wait_seconds": self.wait,
                "data_wait_share": self.wait / self.loop_seconds if self.loop_seconds else 0.0,
                "own_seconds": s.step_seconds + s.own_seconds,
                "stack_members": stacked_with.get(id(s), 1),
            }
            results.append((s.head, s.best, s.history, timing))
        return results


def train_together(
    task: TaskSpec, runs: list[SeededHead], problem, device, order_seeds: int | list[int], on_epoch=None
):
    """Train ``runs`` (one batch size) in lockstep to their end (``Lockstep``). Returns, per run,
    (head with its best epoch restored, best, history, timing)."""
    lockstep = Lockstep(task, runs, problem, device, order_seeds)
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
):
    """Train one head with one seed; return it with the best epoch (by selection score) restored.
    ``moments``: (mean, std) of the training features to standardize the input with, or None.
    ``on_epoch(epoch, selection_score)`` is called after each epoch (the search prunes there)."""
    run = SeededHead("", spec, settings, seed, moments, encoder_dir)
    return train_together(task, [run], problem, device, seed, on_epoch)[0]
