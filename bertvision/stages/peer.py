"""The ``peer`` stage: one peer method (config ``peers``, ``registry/peers``) on one task and
seed, its own settings chosen on the selection split, scored once on every split with the
choice it made. The record has the baseline's shape (the summary reads both alike): the
metrics, the selection score that made the choice, the trainable and encoder parameters, the
seconds of the kept run, and every setting it tried with its selection score."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.config.settings import BaselineSettings, FinetuneCompute, PeerSettings
from bertvision.files import atomic_path, atomic_write_json, atomic_write_parquet
from bertvision.layout import PEER_METRICS, PEER_PREDICTIONS, split_file
from bertvision.models.backbone import resolve_pretrained
from bertvision.peers import embedding as emb
from bertvision.peers.adapted import bitfit, lora, trainable_parameters
from bertvision.registry.metrics import predictions_from_outputs, score
from bertvision.registry.peers import get_peer
from bertvision.registry.task_spec import TaskSpec, scored_splits, splits_of
from bertvision.runtime.device import pick_device, set_threads
from bertvision.runtime.precision import computed_in

log = logging.getLogger(__name__)


def _raw_rows(raw_dir: Path, splits) -> dict[str, pd.DataFrame]:
    return {s: pd.read_parquet(split_file(raw_dir, s)) for s in splits}


def _scored(task: TaskSpec, rows: dict[str, pd.DataFrame], outputs: dict[str, np.ndarray]) -> tuple[dict, pd.DataFrame]:
    """(metrics per split, predictions table) of ``outputs`` (split -> (N, C)) on the raw rows."""
    metrics, tables = {}, []
    for name, out in outputs.items():
        frame = rows[name]
        metrics[name] = score(task, out, frame["label"].to_numpy(), frame["idx"].to_numpy())
        pred = predictions_from_outputs(out, task.kind)
        tables.append(pd.DataFrame({"idx": frame["idx"], "label": frame["label"], "prediction": pred, "split": name}))
    return metrics, pd.concat(tables, ignore_index=True)


def encoded_texts(task, settings: PeerSettings, rows: dict[str, pd.DataFrame], device=None) -> tuple[np.ndarray, dict]:
    """Every text of ``rows`` (``emb.all_texts``' order) through the backbone with its own pooling:
    (vectors, what the peers' records say of them: pooling, encoder parameters, seconds, device,
    precision, rows per split)."""
    method = settings.method
    started = time.perf_counter()
    encoded = emb.encode_texts(
        settings.backbone, emb.all_texts(task, rows), method.max_length, method.batch_size, device, method.backend
    )
    return encoded.vectors, {
        "pooling": encoded.pooling.to_dict(),
        "encoder_parameters": encoded.encoder_parameters,
        "encode_seconds": time.perf_counter() - started,
        "real_tokens": encoded.real_tokens,
        "padded_tokens": encoded.padded_tokens,
        "device": str(device if device is not None and encoded.backend == "torch" else "cpu"),
        "precision": computed_in("fp32", encoded.backend),
        "rows": {s: len(frame) for s, frame in rows.items()},
    }


def embed_task(task: TaskSpec, model_name: str, settings: PeerSettings, compute: FinetuneCompute, raw_dir: Path,
               out: Path, threads: int | None = None) -> None:  # fmt: skip
    """The ``embed`` stage: the sentence embeddings every peer that trains no encoder reads,
    encoded once per task (``layout.EMBEDDINGS``)."""
    set_threads(threads)
    rows = _raw_rows(raw_dir, splits_of(task))
    vectors, encoding = encoded_texts(task, settings, rows, pick_device(compute.device))
    with atomic_path(out) as tmp, open(tmp, "wb") as f:  # a file object: np.savez adds no ".npz"
        np.savez(f, vectors=vectors, encoding=json.dumps({"task": task.name, "model": model_name, **encoding}))
    log.info("%s: %d texts embedded in %.1f s, %.3f padded tokens per real one", task.name, len(vectors),
             encoding["encode_seconds"], encoding["padded_tokens"] / max(encoding["real_tokens"], 1))  # fmt: skip


def read_embeddings(path: Path, rows: dict[str, pd.DataFrame]) -> tuple[np.ndarray, dict]:
    """``embed_task``'s file, checked against the rows it must cover."""
    with np.load(path) as saved:
        vectors, encoding = saved["vectors"], json.loads(str(saved["encoding"]))
    counts = {s: len(frame) for s, frame in rows.items()}
    if encoding["rows"] != counts:
        raise ValueError(f"{path}: embeds rows {encoding['rows']}, the task's splits have {counts}: run embed again")
    return vectors, encoding


def sentence_embedding(task, settings: PeerSettings, rows: dict[str, pd.DataFrame], device=None,
                       embeddings: Path | None = None) -> dict:  # fmt: skip
    """The ``embedding`` peer (a linear model, its strength chosen on selection) or the ``cosine``
    peer (no training) on the backbone's own sentence embedding: ``embeddings``, the task's shared
    encoding (``embed_task``), or encoded here."""
    method = settings.method
    if embeddings is None:
        vectors, encoding = encoded_texts(task, settings, rows, device)
    else:
        vectors, encoding = read_embeddings(embeddings, rows)
    fields = emb.split_embeddings(task, rows, vectors)
    scored = scored_splits(task)
    if method.method == "cosine":
        outputs = {s: emb.cosine(fields[s]) for s in scored}
        chosen, tried, params, fit_seconds = {}, [], 0, 0.0
    else:
        features = {s: emb.feature_sets(fields[s]) for s in rows}
        labels = {s: rows[s]["label"].to_numpy() for s in rows}

        def selection_score(out, split):
            return task.primary_score({split: score(task, out, labels[split], rows[split]["idx"].to_numpy())}, split)

        model, kept, tried = emb.fit_on_selection(task, features, labels, method.regularization, selection_score)
        chosen = {k: kept[k] for k in ("features", "regularization")}
        outputs = {s: emb.outputs_of(task, model, features[s][chosen["features"]]) for s in scored}
        params, fit_seconds = emb.parameter_count(model), kept["fit_seconds"]
    metrics, predictions = _scored(task, rows, outputs)
    return {
        "metrics": metrics,
        "predictions": predictions,
        "chosen": chosen,
        "tried": tried,
        "pooling": encoding["pooling"],
        "trainable_parameters": params,
        "encoder_parameters": encoding["encoder_parameters"],
        "train_seconds": encoding["encode_seconds"] + fit_seconds,
        "device": encoding["device"],
        "precision": encoding["precision"],
        # the encoding was the task's shared embed job, whose seconds count in this peer's whole cost
        "shared_encoding": embeddings is not None,
    }


def adapted_encoder(task, settings: PeerSettings, compute, tokens_dir: Path, raw_dir: Path, seed: int,
                    threads, micro_batches) -> dict | None:  # fmt: skip
    """LoRA or BitFit: one run of the baseline's schedule per learning rate of the grid, the run
    and epoch kept by the selection score; each kept model is scored on every split as it is
    made, and the best one's scores are kept (the dev scores of the others are never read)."""
    from bertvision.training.encoder import EvalData
    from bertvision.training.encoder_session import EncoderSession

    method = settings.method
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    adapt = lora(method, task) if method.method == "lora" else bitfit
    tried, best = [], None
    for rate in method.learning_rates:
        schedule = BaselineSettings(
            backbone=settings.backbone, epochs=method.epochs, optimizer=settings.optimizer.replace(learning_rate=rate)
        )
        session = EncoderSession(
            [task], schedule, compute, {task.name: tokens_dir}, method.epochs, seed, threads, micro_batches, adapt
        )
        trainer = session.trainers[task.name]
        history, kept, state = session.train_keeping_best_epoch(
            trainer, evals, method.epochs, settings.optimizer.eval_batch_size, f"{method.method} lr {rate:g}"
        )
        session.close()
        if not session.ranks.main:
            continue
        tried.append({"learning_rate": rate, "best_epoch": kept["epoch"], "selection": kept["score"],
                      "train_seconds": session.train_seconds, "history": history})  # fmt: skip
        if best is None or kept["score"] > best["selection"]:
            trainer.model.load_state_dict(state)
            metrics, predictions, _ = trainer.evaluate(evals, settings.optimizer.eval_batch_size)
            best = {
                "selection": kept["score"],
                "metrics": metrics,
                "predictions": predictions,
                "chosen": {"learning_rate": rate, "epoch": kept["epoch"]},
                "trainable_parameters": trainable_parameters(trainer.model),
                "train_seconds": kept["train_seconds"],
                **{k: v for k, v in session.record().items() if k in ("encoder_parameters", "device", "precision")},
            }
    if best is None:
        return None
    best.pop("selection")
    return {**best, "tried": tried}


def setfit(task, settings: PeerSettings, rows: dict[str, pd.DataFrame], seed: int) -> dict:
    """SetFit, one run per body learning rate, the one kept by its selection score."""
    from bertvision.peers.setfit_run import setfit_outputs, setfit_parameters, train_setfit

    method, field = settings.method, task.text_fields[0]
    source = resolve_pretrained(settings.backbone)
    texts = {s: [str(t) for t in rows[s][field]] for s in rows}
    tried, best = [], None
    for rate in method.learning_rates:
        started = time.perf_counter()
        model = train_setfit(source, method, rate, texts["train"], rows["train"]["label"].to_numpy(), seed)
        seconds = time.perf_counter() - started
        selection = {"selection": setfit_outputs(model, texts["selection"], task.num_labels)}
        chosen_score = task.primary_score(_scored(task, rows, selection)[0], "selection")
        tried.append({"learning_rate": rate, "selection": chosen_score, "train_seconds": seconds})
        if best is None or chosen_score > best[0]:
            body = sum(p.numel() for p in model.model_body.parameters())
            best = (chosen_score, rate, model, seconds, body)
    _, rate, model, seconds, body = best
    metrics, predictions = _scored(
        task, rows, {s: setfit_outputs(model, texts[s], task.num_labels) for s in scored_splits(task)}
    )
    return {
        "metrics": metrics,
        "predictions": predictions,
        "chosen": {"learning_rate": rate},
        "tried": tried,
        "trainable_parameters": setfit_parameters(model),
        "encoder_parameters": body,
        "train_seconds": seconds,
        "device": str(model.model_body.device),
        "precision": "fp32",
    }


def run_peer(
    task: TaskSpec,
    model_name: str,
    settings: PeerSettings,
    compute: FinetuneCompute,
    tokens_dir: Path,
    raw_dir: Path,
    out_dir: Path,
    seed: int,
    threads: int | None = None,
    micro_batches: int = 1,
    embeddings: Path | None = None,
) -> None:
    """``embeddings``: the task's sentence embeddings (``embed_task``), read by the peers that
    train no encoder; without it they encode the texts themselves."""
    name = settings.method.method
    peer = get_peer(name)
    if why := peer.inapplicable(task):
        raise ValueError(f"peer {name} does not apply to task {task.name}: {why}")
    set_threads(threads)
    started = time.perf_counter()
    if peer.reads_embeddings:
        rows = _raw_rows(raw_dir, splits_of(task))
        device = pick_device(compute.device) if embeddings is None else None  # given: nothing to encode
        result = sentence_embedding(task, settings, rows, device, embeddings)
    elif name == "setfit":
        result = setfit(task, settings, _raw_rows(raw_dir, splits_of(task)), seed)
    else:
        result = adapted_encoder(task, settings, compute, tokens_dir, raw_dir, seed, threads, micro_batches)
        if result is None:  # not the main rank
            return
    predictions = result.pop("predictions")
    record = {
        "task": task.name,
        "model": model_name,
        "peer": name,
        "label": peer.label,
        "seed": seed,
        "deterministic": peer.deterministic,
        "selection_score": task.primary_score(result["metrics"], "selection"),
        **result,
        "job_seconds": time.perf_counter() - started,
        "settings": settings.to_dict(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(predictions, out_dir / PEER_PREDICTIONS)
    atomic_write_json(record, out_dir / PEER_METRICS)
    log.info("%s %s: chose %s on selection (%.4f); %s %s", task.name, name, result["chosen"],
             record["selection_score"], task.eval_splits[0], result["metrics"][task.eval_splits[0]])  # fmt: skip
