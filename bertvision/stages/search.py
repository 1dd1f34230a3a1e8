"""Hyperparameter search with optuna: one study per (task, checkpoint, head), maximizing the
head's primary metric on the selection split (dev is never seen). Several workers, each its
own process or cluster job, share the study through its storage (a journal file or an RDB
URL); worker w runs its own share of ``search.trials`` (``worker_quota``), so the study ends with
exactly that many finished trials however the workers interleave. Trials start from the head's
final settings (``WorkflowSettings.head_settings``); the best trial's parameters replace them
in the final head training (``stages.train_heads``, the one place they are applied).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import optuna

from bertvision.config.settings import HeadRuntimeSettings, HeadSettings, HeadTrainingSettings, SearchSettings
from bertvision.features.source import StreamSource
from bertvision.files import atomic_write_json, read_json, sha256_file
from bertvision.layout import STUDY_LABEL
from bertvision.registry.heads import searchable_parameters
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.device import set_threads
from bertvision.training.loop import train_one
from bertvision.training.problems import Problems
from bertvision.training.search_space import applicable_space, apply_params

log = logging.getLogger(__name__)

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def suggest(trial: optuna.Trial, name: str, dist: dict):
    if "choices" in dist:
        return trial.suggest_categorical(name, list(dist["choices"]))
    if searchable_parameters()[name] is int:
        return trial.suggest_int(name, int(dist["low"]), int(dist["high"]), log=bool(dist.get("log", False)))
    return trial.suggest_float(name, float(dist["low"]), float(dist["high"]), log=bool(dist.get("log", False)))


def study_name(
    label: str, spec: dict, settings: HeadTrainingSettings, search: SearchSettings, manifest: Path | StreamSource
) -> str:
    """``label`` plus a digest of everything the trials depend on, so a changed setting or
    re-extracted features start a new study while a rerun of the same one (a killed job's)
    resumes it. The trials and workers are in it too: a study resumed under another count ran
    other trials than that count's (a lower count kept its extra trials, more workers drew their
    own), and its cost would be counted from the last job alone. Every search setting is in it:
    the head seed too, which every trial trains with (without it a changed heads.seeds resumed
    the finished study, its trials trained with the old seed). Streamed states are named by the
    contents of what they are computed from, the encoder's weights and the token ids, as stored
    ones are by their manifest's shard digests: paths and sizes stay the same when new data or a
    new fine-tuning run rewrites them, and the finished study of the old ones was resumed."""
    digest = hashlib.sha256()
    digest.update(json.dumps([spec, settings.to_dict(), search.to_dict()], sort_keys=True).encode())
    if isinstance(manifest, StreamSource):
        digest.update(manifest.to_json().encode())
        encoder = [Path(manifest.checkpoint) / name for name in ("model.safetensors", "config.json")]
        for path in [*encoder, *sorted(p for p in Path(manifest.tokens_dir).iterdir() if p.is_file())]:
            digest.update(f"{path.name}:{sha256_file(path) if path.exists() else None}".encode())
    else:
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
    """``config``: search.pruner (optuna's own pruners: median, successive halving)."""
    if config["type"] == "none":
        return optuna.pruners.NopPruner()
    if config["type"] == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=max(1, int(config["warmup_epochs"])), reduction_factor=2
        )
    return optuna.pruners.MedianPruner(
        n_startup_trials=int(config["startup_trials"]), n_warmup_steps=int(config["warmup_epochs"])
    )


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=FINISHED)


def worker_quota(search: SearchSettings, worker: int) -> int:
    """The trials worker ``worker`` runs: ``search.trials`` split as evenly as it goes, the first
    workers taking one more. A fixed share per worker, rather than a cap on the study's count,
    because workers that finish a trial at the same moment would each see room for one more."""
    if not 0 <= worker < search.workers:
        raise ValueError(f"worker {worker}: search.workers is {search.workers}, so workers are 0..{search.workers - 1}")
    return search.trials // search.workers + (worker < search.trials % search.workers)


def run_worker(
    task: TaskSpec,
    keys: dict,
    head: HeadSettings,
    runtime: HeadRuntimeSettings,
    search: SearchSettings,
    manifest: Path | StreamSource,
    raw_dir: Path,
    storage: str,
    worker: int,
    out: Path,
    threads: int | None = None,
) -> dict:
    """Run this worker's share of the study's trials and write what it ran to ``out``. ``keys``:
    the study's model, task, ftseed, checkpoint and head (its record carries them); ``head``: its
    spec and final training settings, which the trials' parameters replace."""
    spec, settings = head.spec, head.training
    name = study_name(STUDY_LABEL.format(**keys), spec, settings, search, manifest)
    set_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problems = Problems(task, manifest, runtime, settings.in_memory_max_mb, raw_dir)
    problem, device = problems.get(spec), problems.device
    moments = problems.moments(spec) if settings.standardize else None
    label_moments = problems.label_moments(spec)
    space = applicable_space(search.space, spec)
    study = optuna.create_study(
        storage=open_storage(storage),
        study_name=name,
        direction="maximize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=search.seed + worker, n_startup_trials=search.startup_trials),
        pruner=build_pruner(search.pruner),
    )
    done = sum(t.user_attrs.get("worker") == worker for t in finished_trials(study))
    budget = worker_quota(search, worker) - done
    seed = search.head_seed

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", worker)
        params = {p: suggest(trial, p, dist) for p, dist in space.items()}
        candidate = apply_params(head, params)

        def report(epoch: int, score: float) -> None:
            trial.report(score, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        _, best, _, _ = train_one(
            task,
            candidate.spec,
            candidate.training,
            problem,
            seed,
            device,
            moments,
            report,
            problems.encoder_dir,
            label_moments,
        )
        return float(best["score"])

    if budget > 0:
        study.optimize(objective, n_trials=budget)
    mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == worker]
    trials = [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params} for t in mine]
    record = {"study": name, "storage": storage, "worker": worker, "keys": keys, "space": space, "trials": trials}
    atomic_write_json(record, out)
    log.info(
        "%s worker %d: %d trials of this worker in %s (%d finished in the study)",
        name,
        worker,
        len(mine),
        storage,
        len(finished_trials(study)),
    )
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
        raise RuntimeError(
            f"study {name} in {storage}: no trial completed "
            f"({len(trials)} trials: {sorted({t.state.name for t in trials})}); see the worker logs"
        )
    numbers = [t.number for t in trials]
    if len(numbers) != len(set(numbers)):
        raise RuntimeError(f"study {name} in {storage}: duplicated trial numbers {numbers}")
    best = study.best_trial
    record = {
        "study": name,
        "storage": storage,
        "keys": workers[0]["keys"],
        "space": space,
        "best_params": best.params,
        "best_value": best.value,
        "best_trial": best.number,
        "trials": {
            state: sum(t.state.name == state for t in trials) for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")
        },
        "trial_numbers": sorted(numbers),
    }
    atomic_write_json(record, out)
    return record
