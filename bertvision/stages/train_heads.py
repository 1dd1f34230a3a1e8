"""The ``train_heads`` stage (and ``train_heads_subset``): train every configured head
architecture on one checkpoint's features, for each seed. The number of epochs is chosen on
the selection split (early stopping, best epoch restored); the evaluation splits are only ever
scored, never used for a choice. One job per checkpoint: the features are read and verified
once for all heads, or (``store: false``) computed by the frozen encoder in this job. Each head
comes with its final training settings (``WorkflowSettings.head_settings``); a searched head's
study's best parameters are put on top here, the one place they are applied."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import NamedTuple

from bertvision.config.settings import HeadRaceSettings, HeadRuntimeSettings, HeadSettings
from bertvision.evaluation.ensemble import load_logits
from bertvision.features.source import StreamSource
from bertvision.files import atomic_write_json, atomic_write_parquet, read_json
from bertvision.layout import HEAD_METRICS, HEAD_PREDICTIONS, head_metrics_files, head_run_dir
from bertvision.models.head_io import save_head
from bertvision.models.heads import core_head, count_parameters
from bertvision.registry.heads import head_pair
from bertvision.registry.task_spec import TaskSpec
from bertvision.reporting.results import raced_out
from bertvision.runtime.device import set_threads
from bertvision.training.loop import Lockstep, SeededHead
from bertvision.training.problems import Problems
from bertvision.training.racing import race as run_race
from bertvision.training.search_space import apply_params

log = logging.getLogger(__name__)


class Plan(NamedTuple):
    """One head and seed to train: the run, the problem it trains on and its search record."""

    run: SeededHead
    problem: object
    search: dict | None


def train_heads(
    task: TaskSpec,
    heads: dict[str, HeadSettings],
    runtime: HeadRuntimeSettings,
    manifest: Path | StreamSource,
    seeds: list[int],
    out_dir: Path,
    threads: int | None = None,
    raw_dir: Path | None = None,
    bert_logits: Path | None = None,
    searched: dict[str, Path] | None = None,
    train_fraction: float = 1.0,
    race: HeadRaceSettings | None = None,
    survivors_from: Path | None = None,
    finish: list[str] | None = None,
) -> None:
    """Write a run directory (weights, eval predictions, metrics) under ``out_dir`` for every
    head (name -> its spec and final training settings) and seed. ``manifest``: the checkpoint's
    feature manifest, or (``store: false``) a StreamSource whose frozen encoder computes the
    states here; ``raw_dir``: the task's
    canonical splits (span tasks decode answers from their contexts); ``bert_logits``: BERT's
    ``eval_logits.npz`` at the same checkpoint, for the head + BERT ensembles; ``searched``:
    head name -> its study's ``best.json``, whose parameters replace the head's settings;
    ``train_fraction``: train on that nested share of the training rows; ``race``: how the job
    chooses among its heads (None: the grid, every head with every seed to its end; racing:
    ``training.racing``, and each record says where the race stopped it); ``survivors_from``: the
    first fine-tuning seed's heads at this checkpoint, whose race decides for every fine-tuning
    seed: only the heads it kept train here, each with every seed to its end. Deciding per job
    let each fine-tuning seed keep other heads, and a head stopped in one seed's job is no
    candidate at all (``reporting.ranking``): the default run's SST-2 was left with none at 0.3.
    ``finish``: heads the race never stops here, since another experiment reads their runs from this
    job (the shared encoders' heads on a checkpoint the main pipeline trains them on).

    Every head that shares a problem and batch size trains in lockstep, each batch drawn once for
    all of them (``train_together``). Stored features: one lockstep group per seed, in that seed's
    batch order, so each run trains exactly as it would alone. Streamed: every seed in one group
    on one encoder pass per epoch, in the first seed's batch order (seeds then differ in
    initialization and dropout only). Each run's ``seconds`` is its own work (steps, selection
    scoring, evaluation) plus an even share of the group's common work (batches, the encoder)."""
    t_start = time.perf_counter()
    searched = searched or {}
    set_threads(threads)
    problems = Problems(task, manifest, runtime, HeadSettings.memory_mb(heads.values()), raw_dir, train_fraction)
    bert = load_logits(bert_logits) if bert_logits else None
    spent_before = problems.encoder.spent() if problems.streamed else None
    plans = []
    for head_name, head in heads.items():
        search = read_json(searched[head_name]) if head_name in searched else None
        if search:
            head = apply_params(head, search["best_params"])
        problem = problems.get(head.spec)
        moments = problems.moments(head.spec) if head.training.standardize else None
        label_moments = problems.label_moments(head.spec)
        plans += [
            Plan(
                SeededHead(head_name, head.spec, head.training, seed, moments, problems.encoder_dir, label_moments),
                problem,
                search,
            )
            for seed in seeds
        ]
    decided = survivors_from is not None and race is not None and race.racing
    if decided:
        decisions = map(read_json, head_metrics_files([survivors_from]))
        kept = {record["head"] for record in decisions if not raced_out(record)}
        plans = [plan for plan in plans if plan.run.name in kept]
    racing = race is not None and race.racing and len(heads) > 1 and not decided
    if racing:  # the first seed's heads race; only the survivors train with the other seeds
        groups = _lockstep_groups([p for p in plans if p.run.seed == seeds[0]], problems, seeds[0], task)
        survivors = {
            state.run.name for state in run_race([g for _, g in groups], race.rungs, race.keep, frozenset(finish or ()))
        }
        finished = [item for group, lockstep in groups for item in _evaluated(task, group, lockstep, problems, bert)]
        rest = [p for p in plans if p.run.seed != seeds[0] and p.run.name in survivors]
    else:
        finished, rest = [], plans
    for group, lockstep in _lockstep_groups(rest, problems, seeds[0], task):
        lockstep.advance()
        finished += _evaluated(task, group, lockstep, problems, bert)
    for f in finished:
        if decided:
            f["record"]["race"] = {**race.to_dict(), "raced_out_at_epoch": None, "decided_by": str(survivors_from)}
        else:
            f["record"]["race"] = None if not racing else {**race.to_dict(), "raced_out_at_epoch": f["raced_out_at"]}
    shared = (time.perf_counter() - t_start - sum(f["own"] for f in finished)) / len(finished)
    spent = {k: v - spent_before[k] for k, v in problems.encoder.spent().items()} if problems.streamed else None
    for f in finished:
        f["record"]["seconds"] = f["own"] + shared
        f["record"]["runs_together"] = len(finished)
        if spent is not None:
            f["record"]["stream"] = {**spent, "shared_seconds_each": shared, "runs_per_pass": len(finished)}
        _write(task, f, out_dir)


def _lockstep_groups(plans: list[Plan], problems: Problems, first_seed: int, task: TaskSpec) -> list[tuple]:
    """The plans that train together, each group with its (not yet trained) ``Lockstep``: one
    problem and batch size, and one batch order: the run's seed's for stored features, the first
    seed's for streamed ones (one encoder pass per epoch for every seed)."""
    groups: dict = {}
    for plan in plans:
        order_seed = first_seed if problems.streamed else plan.run.seed
        groups.setdefault((id(plan.problem), plan.run.settings.batch_size, order_seed), []).append(plan)
    return [
        (group, Lockstep(task, [plan.run for plan in group], group[0].problem, problems.device, order_seed))
        for (_, _, order_seed), group in groups.items()
    ]


def _evaluated(task: TaskSpec, group: list[Plan], lockstep: Lockstep, problems: Problems, bert) -> list[dict]:
    """Evaluate each trained run of ``group``; their records (less ``seconds``) with the head,
    predictions, own seconds and where a race stopped it."""
    problem = group[0].problem
    results = lockstep.results()
    train_source = problems.feats["train"].manifest
    finished = []
    for (run, _, search), (head, best, history, timing), state in zip(group, results, lockstep.states):
        t0 = time.perf_counter()
        pair = head_pair(run.spec)
        # BERT reads a pair joint: the service combines a head with it only where both read one pass
        metrics, predictions, ensembles = problem.evaluate(head, bert if pair == "joint" else None)
        params = count_parameters(head)
        record = {
            "task": task.name,
            "head": run.name,
            "head_spec": run.spec,
            "pair": pair if problems.task.two_texts else None,  # a pair task's texts as the head read them
            "seed": run.seed,
            "source": train_source["source"],
            "parameters": params,
            "encoder_parameters": train_source["encoder_parameters"],
            "parameter_percent": 100.0 * params / train_source["encoder_parameters"],
            "train_fraction": problems.train_fraction,
            "train_examples": problem.n_train,
            "training_settings": {
                k: getattr(run.settings, k) for k in ("learning_rate", "batch_size", "max_epochs", "weight_decay")
            },
            "search": None
            if search is None
            else {k: search[k] for k in ("study", "best_params", "best_value", "trials")},
            "best_epoch": best["epoch"],
            "selection_metrics": best["metrics"],
            "metrics": metrics,
            "ensembles": ensembles,
            "history": history,
            **timing,
            "data_in_memory": problem.data_in_memory,
            "features_stored": not problems.streamed,
            "device": str(problems.device),
            # the precision of the states the head read (extraction's, or the stream's)
            "states_precision": train_source.get("precision"),
            "states_backend": train_source.get("backend", "torch"),
        }
        core = core_head(head)
        if hasattr(core, "layer_weights"):  # the learned layer mix (LP, token-pool, cosine)
            record["layer_weights"] = core.layer_weights().detach().cpu().tolist()
        if hasattr(core, "gamma"):
            record["gamma"] = float(core.gamma.detach())
        finished.append(
            {
                "record": record,
                "head": head,
                "predictions": predictions,
                "own": timing["own_seconds"] + time.perf_counter() - t0,
                "raced_out_at": state.raced_out_at,
            }
        )
    return finished


def _write(task: TaskSpec, finished: dict, out_dir: Path) -> None:
    record = finished["record"]
    out = head_run_dir(out_dir, record["head"], record["seed"])
    save_head(finished["head"], record["head"], record["head_spec"], out)
    atomic_write_parquet(finished["predictions"], out / HEAD_PREDICTIONS)
    atomic_write_json(record, out / HEAD_METRICS)
    log.info(
        "%s %s seed %d: best epoch %d, eval %s, data wait %.2f%%",
        task.name,
        record["head"],
        record["seed"],
        record["best_epoch"],
        {
            s: {k: round(v, 4) for k, v in m.items() if k in task.metrics}
            for s, m in record["metrics"].items()
            if s in task.eval_splits
        },
        100 * record["data_wait_share"],
    )
