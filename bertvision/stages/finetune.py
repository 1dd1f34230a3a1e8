"""The ``finetune`` stage: train the backbone with its task head to one configured epoch fraction,
going on from the one before, and save that checkpoint with its training record. Fraction 0 is
the pretrained encoder untouched (plus a freshly initialised head). Scoring BERT's own head is
rule ``score_bert``'s (``stages/score_bert``): from the extraction's pass where the states are
stored, so a checkpoint is read once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import torch

from bertvision.config.settings import FinetuneCompute, FinetuneSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.files import atomic_path, atomic_write_json
from bertvision.layout import RESUME_STATE, TRAIN_RECORD, Checkpoint, checkpoint_dir, split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.runtime.distributed import Ranks
from bertvision.training.encoder_session import EncoderSession, initial_models, run_record, save_checkpoint

log = logging.getLogger(__name__)


def finetune(
    task: TaskSpec,
    model_name: str,
    settings: FinetuneSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    out_dir: Path,
    seed: int,
    checkpoint: Checkpoint,
    previous: Path | None = None,
    optimizer_state: Literal["keep", "drop"] = "keep",
    threads: int | None = None,
    micro_batches: int = 1,
) -> None:
    """Fine-tune ``settings.backbone`` (the config's backbone ``model_name``) from the checkpoint
    directory ``previous`` (its weights and ``RESUME_STATE``: the run's checkpoint before this one,
    which the rule names; none for the run's first, which starts from the pretrained encoder) to
    ``checkpoint``, and write its directory under ``out_dir``.
    One job per checkpoint, so that a race (``heads.race``) can stop the run between two; the
    schedule spans ``settings.schedule_epochs``, and a run taken in steps equals one taken at once.
    ``optimizer_state`` "drop": keep only the counters in the resume state (the run's last
    checkpoint: nothing is configured to go on from it, and AdamW's moments are twice the model).
    A later job that goes on from such a checkpoint replays its steps (``replay``).
    ``micro_batches``: split each batch into that many forward/backward passes whose
    gradients are accumulated (the effective batch, and the result, stay the same); the
    retry after a CUDA out-of-memory error raises it.
    ``settings.optimizer`` None (checkpoint 0, ``untouched``): nothing trains."""
    if settings.optimizer is None:
        return untouched(task, model_name, settings, compute, tokens_dir, out_dir, seed, checkpoint, threads)
    session = EncoderSession(
        [task], settings, compute, {task.name: tokens_dir}, settings.schedule_epochs, seed, threads, micro_batches
    )
    trainer = session.trainers[task.name]
    if previous is not None:
        state = load_resume_state(previous / RESUME_STATE)
        if state.get("resumable"):
            session.resume(state, previous / "model.safetensors")
        else:
            replay(session, state, previous / "model.safetensors")
    step = int(round(checkpoint.fraction * session.epoch_steps))
    log.info("checkpoint %s at step %d, from step %d", checkpoint, step, session.step)
    session.train(step, desc="finetune")
    with session.aside() as main:
        if main:
            trained = dict(step=session.step, examples_seen=trainer.seen, train_loss_recent=trainer.recent_loss,
                           train_seconds=session.train_seconds, train_padding_ratio=trainer.padding_ratio)  # fmt: skip
            record = checkpoint_record(task, model_name, checkpoint, **trained) | session.record()
            resume = session.resume_state(with_optimizer=optimizer_state == "keep")
            write_checkpoint(trainer.model, checkpoint_dir(out_dir, checkpoint), record, resume)
            log.info("checkpoint %s at step %d saved", checkpoint, session.step)
    session.close()


def untouched(task, model_name, settings, compute, tokens_dir, out_dir, seed, checkpoint, threads) -> None:
    """Checkpoint 0: the task model as fine-tuning initialises it (``initial_models``), which
    follows from the backbone, the task's training labels and the seed alone, so that a change to
    fine-tuning's settings leaves the untouched encoder's states and heads as they ran. Its resume
    state holds step 0 without an optimizer: the next checkpoint's job starts its own."""
    if checkpoint.fraction != 0:
        raise ValueError(f"checkpoint {checkpoint} trains: its settings need the optimizer's")
    set_threads(threads)
    ranks, device = Ranks.from_env(pick_device(compute.device))
    train = TokenizedSplit.read(split_file(tokens_dir, "train"))
    model = initial_models([task], settings.backbone, seed, {task.name: train})[task.name]
    precision = resolve_precision(device, compute.precision, model.base_model)
    if ranks.main:
        parameters = encoder_parameter_count(model.base_model)
        run = run_record(settings.backbone, seed, parameters, device, precision)
        record = checkpoint_record(task, model_name, checkpoint) | run
        resume = {"step": 0, "train_seconds": 0.0, "resumable": False}
        write_checkpoint(model, checkpoint_dir(out_dir, checkpoint), record, resume)
    ranks.close()


def checkpoint_record(task, model_name, checkpoint, step=0, examples_seen=0, train_loss_recent=None,
                      train_seconds=0.0, train_padding_ratio=None) -> dict:  # fmt: skip
    """A checkpoint's training record (``metrics``: rule score_bert's; none at checkpoint 0)."""
    return {"task": task.name, "model": model_name, "checkpoint": checkpoint.name, "step": step,
            "examples_seen": examples_seen, "metrics": None, "train_loss_recent": train_loss_recent,
            "train_seconds": train_seconds, "train_padding_ratio": train_padding_ratio}  # fmt: skip


def write_checkpoint(model, saved: Path, record: dict, resume: dict) -> None:
    save_checkpoint(model, saved)
    atomic_write_json(record, saved / TRAIN_RECORD)
    save_resume_state(resume, saved / RESUME_STATE)


def replay(session: EncoderSession, state: dict, weights: Path) -> None:
    """Go on from a checkpoint that kept no optimizer state (it was the run's last when it ran,
    and a later one has been configured since): train again from the start to its step, which
    rebuilds AdamW's moments, the schedule and the generators as they were, then take its saved
    weights, so that the new checkpoint goes on from the one whose states were extracted. The
    replay's seconds are set aside: a run taken at once would not have spent them."""
    from safetensors.torch import load_file

    if state["step"]:
        log.info("%s kept no optimizer state: replaying its %d steps", weights.parent, state["step"])
    with session.aside():
        session.train(state["step"], desc="replay")
        trainer = next(iter(session.trainers.values()))
        saved = load_file(weights, device=str(session.device))
        replayed = trainer.model.state_dict()
        gap = max((replayed[k].float() - v.float()).abs().max().item() for k, v in saved.items())
        log.info("replayed weights differ from the saved ones by at most %.3g", gap)
        trainer.model.load_state_dict(saved)
    session.seconds_before = state["train_seconds"]


def save_resume_state(state: dict, path: Path) -> None:
    with atomic_path(path) as target:
        torch.save(state, target)


def load_resume_state(path: Path) -> dict:
    # our own file (optimizer tensors and numpy generator states: not weights-only)
    return torch.load(path, map_location="cpu", weights_only=False)
