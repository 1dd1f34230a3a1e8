"""One encoder-training job, as the partial fine-tuning (``stages/finetune``), the full
fine-tuning baseline (``stages/baseline``) and the task mixtures (``stages/finetune_mixture``)
run it: the set-up, the step loop and the clock they share. A single task is a mixture of one:
its model, its batches in their own order."""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertvision.config.settings import BaselineSettings, FinetuneCompute, FinetuneSettings, MixtureSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.files import atomic_path
from bertvision.layout import split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.training.encoder import EncoderTrainer, load_classifier, optimizer_step_state, steps_per_epoch

log = logging.getLogger(__name__)


def models_sharing_one_encoder(tasks, backbone: str, seed: int) -> dict[str, torch.nn.Module]:
    """Task name -> the backbone with that task's output layer, every model holding one encoder
    module (so a step on any task trains the same encoder): the first one's with a pooler where
    one has it, since a sequence classifier reads the pooler and a span model's encoder has none."""
    models = {task.name: load_classifier(task, backbone, seed) for task in tasks}
    encoders = [model.base_model for model in models.values()]
    shared = next((e for e in encoders if getattr(e, "pooler", None) is not None), encoders[0])
    for model in models.values():
        setattr(model, model.base_model_prefix, shared)
    return models


def initial_models(tasks, backbone: str, seed: int, trains: dict[str, TokenizedSplit]) -> dict[str, torch.nn.Module]:
    """The task models as fine-tuning starts them (``models_sharing_one_encoder``), a regression's
    output at its training labels' mean: checkpoint 0 of a run."""
    models = models_sharing_one_encoder(tasks, backbone, seed)
    for task in tasks:
        if task.kind == "regression":
            start_at_label_mean(models[task.name], trains[task.name].labels)
    return models


def run_record(backbone: str, seed: int, encoder_parameters: int, device, precision: str) -> dict:
    """What every record of an encoder-training stage says about its run."""
    return {
        "backbone": backbone,
        "seed": seed,
        "encoder_parameters": encoder_parameters,
        "device": str(device),
        "precision": precision,
    }


def output_layer(model) -> torch.nn.Linear:
    """The task head's last linear layer, whatever the architecture calls it (BERT's ``classifier``,
    RoBERTa's ``classifier.out_proj``)."""
    prefix = model.base_model_prefix
    head = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not name.startswith(prefix)]
    return head[-1]


def start_at_label_mean(model, labels: np.ndarray) -> None:
    """A regression's output starts at its training labels' mean, as the BERTVision heads' output
    does (``models.heads.Standardized`` trains them on standardized labels): the first steps go to
    the labels' variation, not to reaching their offset (STS-B's mean is 2.7 on a 0-5 scale; from a
    zero bias, a short or parameter-efficient run spent its steps on the offset)."""
    with torch.no_grad():
        output_layer(model).bias.fill_(float(np.mean(labels)))


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


class EncoderSession:
    """The threads, the device and the ranks (torchrun's), the precision; the task models over
    one encoder, their heads initialised with ``seed``; each task's training tokens and trainer,
    one AdamW with one linear warmup-decay schedule over ``schedule_epochs`` passes over all the
    training rows; the generator of the batch order (``seed``); and a clock of the training time,
    stopped while work is set aside (``aside``)."""

    def __init__(
        self,
        tasks: list[TaskSpec],
        settings: FinetuneSettings | BaselineSettings | MixtureSettings,
        compute: FinetuneCompute,
        tokens_dirs: dict[str, Path],
        schedule_epochs: float,
        seed: int,
        threads: int | None,
        micro_batches: int,
        adapt=None,
    ):
        """``adapt``: a function of a task model that returns the model to train, its parameters
        to leave frozen with ``requires_grad`` False (a peer's LoRA or BitFit, ``peers/adapted``)."""
        set_threads(threads)
        self.ranks, self.device = ranks, device = Ranks.from_env(pick_device(compute.device))
        trains = {t.name: TokenizedSplit.read(split_file(tokens_dirs[t.name], "train")) for t in tasks}
        models = initial_models(tasks, settings.backbone, seed, trains)
        self.encoder = next(iter(models.values())).base_model
        self.encoder_parameters = encoder_parameter_count(self.encoder)  # before any adapter is added
        if adapt is not None:
            models = {n: adapt(m) for n, m in models.items()}
        models = {n: m.to(device) for n, m in models.items()}
        optimizer = settings.optimizer
        self.epoch_steps = sum(steps_per_epoch(len(train), optimizer.batch_size) for train in trains.values())
        self.total_steps = total = max(1, math.ceil(schedule_epochs * self.epoch_steps))
        self.precision = precision = resolve_precision(device, compute.precision, self.encoder)
        step_state = optimizer_step_state(models, optimizer, total, device, precision, ranks)
        self.trainers = {
            t.name: EncoderTrainer(
                t,
                models[t.name],
                trains[t.name],
                optimizer,
                total,
                device,
                precision,
                ranks,
                micro_batches,
                shared_step=step_state,
            )
            for t in tasks
        }
        rows = {name: len(train) for name, train in trains.items()}
        log.info(
            "%s: %s training rows, %d steps a pass, %d scheduled, device %s (rank %d of %d), "
            "%d micro-batch(es) per batch",
            settings.backbone,
            rows,
            self.epoch_steps,
            total,
            device,
            ranks.rank,
            ranks.world,
            micro_batches,
        )
        self.backbone, self.seed, self.rng, self.step = settings.backbone, seed, np.random.default_rng(seed), 0
        # where the current pass over the training rows stands: the generator's state as the pass
        # began and the batches of it already taken (a resumed run draws the same pass again)
        self.pass_start, self.pass_offset = self.rng.bit_generator.state, 0
        self.started, self.set_aside, self.aside_since, self.seconds_before = time.perf_counter(), 0.0, None, 0.0

    def train(self, until: int, after_step=None, desc: str = "train") -> None:
        """Optimizer steps up to step ``until``, pass after pass over the training rows; each
        pass is every task's length-bucketed batches, several tasks' batches in one shuffled
        order. ``after_step(step)`` runs after each step."""
        progress = tqdm(total=until - self.step, desc=desc, mininterval=10, unit="step")
        while self.step < until:
            if self.pass_offset:  # a pass left part-way: draw it again from its start
                self.rng.bit_generator.state = self.pass_start
            else:
                self.pass_start = self.rng.bit_generator.state
            batches = [(name, rows) for name, trainer in self.trainers.items() for rows in trainer.batches(self.rng)]
            order = self.rng.permutation(len(batches)) if len(self.trainers) > 1 else range(len(batches))
            for position in range(self.pass_offset, len(batches)):
                name, rows = batches[order[position]]
                self.trainers[name].train_step(rows)
                self.step += 1
                self.pass_offset = position + 1
                progress.update(1)
                if after_step is not None:
                    after_step(self.step)
                if self.step >= until:
                    break
            if self.pass_offset == len(batches):
                self.pass_offset = 0
        progress.close()

    def resume_state(self, with_optimizer: bool = True) -> dict:
        """What a later job needs to go on from here exactly as this one would have (the weights
        are the checkpoint's own file): the optimizer, schedule and loss scaler, the batch order's
        generator and place in its pass, the dropout generator, the counters and the clock.
        ``with_optimizer`` False: the counters only (no run goes on from the last checkpoint)."""
        state = {
            "step": self.step,
            "rng": self.rng.bit_generator.state,
            "pass_start": self.pass_start,
            "pass_offset": self.pass_offset,
            "train_seconds": self.train_seconds,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "trainers": {
                name: {k: getattr(t, k) for k in ("step", "seen", "real_tokens", "padded_tokens")}
                | {"losses": [float(x) for x in t.losses[-50:]]}
                for name, t in self.trainers.items()
            },
            "resumable": with_optimizer,
        }
        if with_optimizer:
            step = next(iter(self.trainers.values())).shared_step
            state |= {
                "optimizer": step.optimizer.state_dict(),
                "scheduler": step.scheduler.state_dict(),
                "scaler": step.scaler.state_dict(),
            }
        return state

    def resume(self, state: dict, weights: Path) -> None:
        """Go on from ``resume_state``'s ``state`` with the model weights of ``weights``."""
        from safetensors.torch import load_file

        if not state.get("resumable"):
            raise ValueError(f"{weights.parent}: the run's last checkpoint keeps no optimizer state to go on from")
        trainer = next(iter(self.trainers.values()))
        trainer.model.load_state_dict(load_file(weights, device=str(self.device)))
        step = trainer.shared_step
        step.optimizer.load_state_dict(state["optimizer"])
        step.scheduler.load_state_dict(state["scheduler"])
        step.scaler.load_state_dict(state["scaler"])
        self.step, self.pass_start, self.pass_offset = state["step"], state["pass_start"], state["pass_offset"]
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        for name, counters in state["trainers"].items():
            for key, value in counters.items():
                setattr(self.trainers[name], key, value)
        self.seconds_before = state["train_seconds"]

    @contextlib.contextmanager
    def aside(self):
        """Work kept out of the training time (saving, evaluating), done on the main rank while
        the others wait: yields whether this rank is the main one."""
        self.aside_since = time.perf_counter()
        yield self.ranks.main
        self.ranks.barrier()
        self.set_aside += time.perf_counter() - self.aside_since
        self.aside_since = None

    @property
    def train_seconds(self) -> float:
        """Seconds of training since the set-up (and in the jobs this one went on from), the work
        set aside not counted."""
        return self.seconds_before + (self.aside_since or time.perf_counter()) - self.started - self.set_aside

    def record(self) -> dict:
        """What every record of an encoder-training stage says about its run (``run_record``)."""
        return run_record(self.backbone, self.seed, self.encoder_parameters, self.device, self.precision)

    def train_keeping_best_epoch(
        self, trainer, evals, epochs: int, eval_batch_size: int, desc: str
    ) -> tuple[list, dict, dict]:
        """Train ``epochs`` passes, scoring ``trainer``'s model on the selection split of
        ``evals`` (``eval_batch_size`` examples a pass) after each: (history, the best epoch's
        {epoch, score, train_seconds}, its weights on the CPU). The dev split takes no part; only
        the main rank scores (the others get None)."""
        task = trainer.task
        history, best, best_state = [], None, None
        for epoch in range(1, epochs + 1):
            self.train(epoch * self.epoch_steps, desc=f"{desc} epoch {epoch}")
            with self.aside() as main:
                if main:
                    metrics = trainer.evaluate(evals.only("selection"), eval_batch_size)[0]["selection"]
                    score = float(metrics[task.primary_metric])
                    history.append(
                        {
                            "epoch": epoch,
                            "step": self.step,
                            "train_seconds": self.train_seconds,
                            "train_loss_recent": trainer.recent_loss,
                            "selection": metrics,
                        }
                    )
                    log.info("epoch %d: selection %s = %.4f", epoch, task.primary_metric, score)
                    if best is None or score > best["score"]:
                        best = {"epoch": epoch, "score": score, "train_seconds": self.train_seconds}
                        best_state = {k: v.detach().to("cpu", copy=True) for k, v in trainer.model.state_dict().items()}
        return history, best, best_state

    def close(self) -> None:
        """Leave the process group (torchrun's ranks)."""
        self.ranks.close()
        log.info("trained %d steps in %.1fs", self.step, self.train_seconds)
