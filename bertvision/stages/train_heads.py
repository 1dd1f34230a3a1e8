"""The ``train_heads`` stage (and ``train_heads_subset``): train every configured head
architecture on one checkpoint's features, for each seed. The number of epochs is chosen on
the selection split (early stopping, best epoch restored); the evaluation splits are only ever
scored, never used for a choice. One job per checkpoint: the features are read and verified
once for all heads."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from bertvision.config.settings import HeadRuntimeSettings, HeadTrainingSettings
from bertvision.evaluation.ensemble import load_logits
from bertvision.layout import HEAD_METRICS, HEAD_PREDICTIONS, head_run_dir
from bertvision.models.head_io import save_head
from bertvision.models.heads import Standardized, count_parameters
from bertvision.registry.tasks import TaskSpec
from bertvision.runtime.device import set_threads
from bertvision.runtime.io import atomic_write_json, atomic_write_parquet, read_json
from bertvision.training.loop import train_one
from bertvision.training.problems import Problems
from bertvision.training.search_space import apply_params

log = logging.getLogger(__name__)


def train_heads(
    task: TaskSpec,
    heads: dict[str, dict],
    settings: HeadTrainingSettings,
    runtime: HeadRuntimeSettings,
    manifest: Path,
    seeds: list[int],
    out_root: Path,
    threads: int | None = None,
    raw_dir: Path | None = None,
    bert_logits: Path | None = None,
    searched: dict[str, Path] | None = None,
    train_fraction: float = 1.0,
) -> None:
    """Write a run directory (weights, eval predictions, metrics) under ``out_root`` for every
    head and seed. ``manifest``: the checkpoint's feature manifest; ``raw_dir``: the task's
    canonical splits (span tasks decode answers from their contexts); ``bert_logits``: BERT's
    ``eval_logits.npz`` at the same checkpoint, for the head + BERT ensembles; ``searched``:
    head name -> its study's ``best.json``, whose parameters replace the configured ones;
    ``train_fraction``: train on that nested share of the training rows."""
    searched = searched or {}
    set_threads(threads)
    problems = Problems(task, manifest, runtime, settings.in_memory_max_mb, raw_dir, train_fraction)
    device = problems.device
    bert = load_logits(bert_logits) if bert_logits else None
    source = problems.feats["train"].manifest["source"]
    encoder_params = problems.feats["train"].manifest["encoder_parameters"]
    for head_name, configured in heads.items():
        search = read_json(searched[head_name]) if head_name in searched else None
        spec, head_settings = apply_params(configured, settings, search["best_params"]) if search else (configured,
                                                                                                        settings)
        problem = problems.get(spec)
        moments = problems.moments(spec) if settings.standardize else None
        for seed in seeds:
            t0 = time.perf_counter()
            head, best, history, timing = train_one(task, spec, head_settings, problem, seed, device, moments)
            metrics, predictions, ensembles = problem.evaluate(head, bert)
            out = head_run_dir(out_root, head_name, seed)
            save_head(head, head_name, spec, out)
            atomic_write_parquet(predictions, out / HEAD_PREDICTIONS)
            params = count_parameters(head)
            record = {
                "task": task.name, "head": head_name, "head_spec": spec, "seed": seed, "source": source,
                "parameters": params, "encoder_parameters": encoder_params,
                "parameter_percent": 100.0 * params / encoder_params,
                "train_fraction": train_fraction, "train_examples": problem.n_train,
                "training_settings": {k: getattr(head_settings, k) for k in ("learning_rate", "batch_size",
                                                                            "max_epochs", "weight_decay")},
                "search": None if search is None else {k: search[k] for k in (
                    "study", "best_params", "best_value", "trials")},
                "best_epoch": best["epoch"], "selection_metrics": best["metrics"], "metrics": metrics,
                "ensembles": ensembles,
                "history": history, "seconds": time.perf_counter() - t0, **timing,
                "data_in_memory": problem.data_in_memory, "device": str(device),
            }
            core = head.head if isinstance(head, Standardized) else head
            if hasattr(core, "layer_weights"):  # the learned layer mix (LP, token-pool)
                record["layer_weights"] = core.layer_weights().detach().cpu().tolist()
                record["gamma"] = float(core.gamma.detach())
            atomic_write_json(record, out / HEAD_METRICS)
            log.info("%s %s seed %d: best epoch %d, eval %s, data wait %.2f%%", task.name, head_name, seed,
                     best["epoch"], {s: {k: round(v, 4) for k, v in m.items() if k in task.metrics}
                                     for s, m in metrics.items() if s in task.eval_splits},
                     100 * timing["data_wait_share"])
