"""Hyperparameter search with optuna: one study per (task, checkpoint, head), maximizing the
head's primary metric on the selection split (dev is never seen). Several workers, each its
own process or cluster job, share the study through its storage (a journal file or an RDB
URL); the study caps the combined number of finished trials. The best trial's parameters
then replace the configured ones in the final head training.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import time
from pathlib import Path

import optuna

from bertvision.device import set_threads
from bertvision.heads import HEADS
from bertvision.io import atomic_write_json, read_json
from bertvision.tasks import TaskSpec

log = logging.getLogger(__name__)

# Searchable parameter -> (where it applies, its type). Training parameters apply to every
# head; architecture parameters only to head types whose constructor takes them.
SEARCHABLE = {
    "learning_rate": ("training", float),
    "weight_decay": ("training", float),
    "batch_size": ("training", int),
    "max_epochs": ("training", int),
    "width": ("head", int),
    "dropout": ("head", float),
}

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def applicable_space(space: dict, spec: dict) -> dict:
    """The part of the configured search space that applies to a head of ``spec['type']``."""
    takes = set(inspect.signature(HEADS[spec["type"]]).parameters)
    return {name: dist for name, dist in space.items() if SEARCHABLE[name][0] == "training" or name in takes}


def suggest(trial: optuna.Trial, name: str, dist: dict):
    if "choices" in dist:
        return trial.suggest_categorical(name, list(dist["choices"]))
    if SEARCHABLE[name][1] is int:
        return trial.suggest_int(name, int(dist["low"]), int(dist["high"]), log=bool(dist.get("log", False)))
    return trial.suggest_float(name, float(dist["low"]), float(dist["high"]), log=bool(dist.get("log", False)))


def apply_params(spec: dict, settings: dict, params: dict) -> tuple[dict, dict]:
    """(head spec, training settings) with the searched ``params`` put in their places."""
    spec, settings = dict(spec), dict(settings)
    for name, value in params.items():
        (settings if SEARCHABLE[name][0] == "training" else spec)[name] = value
    return spec, settings


def study_name(label: str, spec: dict, settings: dict, search: dict, manifest: Path) -> str:
    """``label`` plus a digest of everything the trials depend on, so a changed setting or
    re-extracted features start a new study while a rerun of the same one resumes it."""
    digest = hashlib.sha256()
    digest.update(json.dumps([spec, settings, search["space"], search["pruner"], search["seed"]],
                             sort_keys=True).encode())
    digest.update(Path(manifest).read_bytes())
    return f"{label}-{digest.hexdigest()[:12]}"


def open_storage(storage: str):
    """An RDB URL (``sqlite:///…``, ``postgresql://…``) or a journal file path."""
    if "://" in storage:
        # Workers that start together race to create the schema; the loser sees the tables
        # appear under it and succeeds on a retry.
        for attempt in range(5):
            try:
                return optuna.storages.RDBStorage(storage)
            except Exception as err:  # sqlalchemy's OperationalError / IntegrityError
                if attempt == 4:
                    raise
                log.warning("%s: creating the storage failed (%s); retrying", storage, type(err).__name__)
                time.sleep(1.0 + attempt)
    from optuna.storages.journal import JournalFileBackend

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(storage)))


def build_pruner(config: dict) -> optuna.pruners.BasePruner:
    if config["type"] == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=int(config["startup_trials"]),
                                       n_warmup_steps=int(config["warmup_epochs"]))


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=FINISHED)


def run_worker(task: TaskSpec, head_name: str, spec: dict, settings: dict, search: dict, manifest: Path,
               raw_dir: Path, storage: str, label: str, worker: int, out: Path, threads: int | None = None) -> dict:
    """Run this worker's share of the study's trials and write what it ran to ``out``."""
    name = study_name(label, spec, settings, search, manifest)
    from bertvision.train_head import Problems, train_one

    set_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problems = Problems(task, manifest, settings, raw_dir)
    problem, device = problems.get(spec), problems.device
    moments = problems.moments(spec) if settings["standardize"] else None
    space = applicable_space(search["space"], spec)
    study = optuna.create_study(
        storage=open_storage(storage), study_name=name, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=int(search["seed"]) + worker,
                                           n_startup_trials=int(search["startup_trials"])),
        pruner=build_pruner(search["pruner"]),
    )
    share = math.ceil(int(search["trials"]) / int(search["workers"]))
    budget = min(share, int(search["trials"]) - len(finished_trials(study)))
    seed = int(search["head_seed"])

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", worker)
        params = {p: suggest(trial, p, dist) for p, dist in space.items()}
        trial_spec, trial_settings = apply_params(spec, settings, params)

        def report(epoch: int, score: float) -> None:
            trial.report(score, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        _, best, _, _ = train_one(task, trial_spec, trial_settings, problem, seed, device, moments, on_epoch=report)
        return float(best["score"])

    if budget > 0:
        study.optimize(objective, n_trials=budget, callbacks=[
            optuna.study.MaxTrialsCallback(int(search["trials"]), states=FINISHED)])
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == worker]
    record = {"study": name, "storage": storage, "worker": worker, "head": head_name, "task": task.name,
              "space": space, "trials": [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params}
                         for t in mine]}
    atomic_write_json(record, out)
    log.info("%s worker %d: %d trials of this worker in %s (%d finished in the study)", name, worker, len(mine),
             storage, len(finished_trials(study)))
    return record


def summarize_study(worker_records: list[Path], out: Path) -> dict:
    """Write the study's best parameters, the searched space and the trial counts to ``out``."""
    workers = [read_json(p) for p in worker_records]
    studies = {(w["storage"], w["study"]) for w in workers}
    if len(studies) != 1:
        raise RuntimeError(f"{[str(p) for p in worker_records]}: the workers ran different studies {sorted(studies)}")
    (storage, name), space = studies.pop(), workers[0]["space"]
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise RuntimeError(f"study {name} in {storage}: no trial completed "
                           f"({len(trials)} trials: {sorted({t.state.name for t in trials})}); see the worker logs")
    numbers = [t.number for t in trials]
    if len(numbers) != len(set(numbers)):
        raise RuntimeError(f"study {name} in {storage}: duplicated trial numbers {numbers}")
    best = study.best_trial
    record = {"study": name, "storage": storage, "space": space, "best_params": best.params,
              "best_value": best.value, "best_trial": best.number,
              "trials": {state: sum(t.state.name == state for t in trials)
                         for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")},
              "trial_numbers": sorted(numbers)}
    atomic_write_json(record, out)
    return record


def tuned(spec: dict, settings: dict, best_file: Path | None) -> tuple[dict, dict, dict | None]:
    """(spec, settings, search record) with a finished study's best parameters applied."""
    if best_file is None:
        return spec, settings, None
    record = read_json(best_file)
    spec, settings = apply_params(spec, settings, record["best_params"])
    return spec, settings, record
