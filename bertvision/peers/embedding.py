"""The practitioner's first try with a sentence-embedding backbone: encode each text once with
the backbone's own pooling, then a linear model on the embedding (SBERT's [u, v, |u-v|, u*v] for
a pair), or for a similarity regression the plain cosine of the two embeddings. The
regularisation is chosen on the selection split; nothing here depends on a seed."""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from bertvision.models.backbone import load_pretrained, load_tokenizer, resolve_pretrained
from bertvision.peers.pooling import Pooling, declared_pooling, pool
from bertvision.registry.task_spec import TaskSpec
from bertvision.runtime.backend import backend_of, with_backend

log = logging.getLogger(__name__)


class Encoded(NamedTuple):
    """What ``encode_texts`` returns: (len(texts), dim) float32 rows in the order given, the
    pooling used, the encoder's parameter count, the backend that ran it, and the real and
    padded tokens of the distinct texts' batches."""

    vectors: np.ndarray
    pooling: Pooling
    encoder_parameters: int
    backend: str
    real_tokens: int
    padded_tokens: int


def encode_texts(
    backbone: str,
    texts: list[str],
    max_length: int,
    batch_size: int,
    device: torch.device | None = None,
    backend: str = "torch",
) -> Encoded:
    """Each distinct text of ``texts`` encoded once, in fp32 on ``device`` (the CPU by default)
    by ``backend`` (ONNX Runtime: on the CPU). The texts are tokenized once and batched in order
    of their token counts, each batch padded to its longest (the default's SST-2 texts: 1.04
    padded tokens per real one, against 1.32 in order of their characters)."""
    source = resolve_pretrained(backbone)
    pooling = declared_pooling(source)
    tokenizer = load_tokenizer(source)  # the folder: a hub model's snapshot is looked up once
    device = device if device is not None and backend in ("torch", "auto") else torch.device("cpu")
    model = with_backend(load_pretrained("AutoModel", source).eval().to(device), backend)
    distinct, where = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    tokens = tokenizer([str(t) for t in distinct], truncation=True, max_length=max_length)
    lengths = np.array([len(ids) for ids in tokens["input_ids"]])
    order = np.argsort(lengths, kind="stable")
    out, padded = None, 0
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            # on the right whatever the tokenizer's config says: pooling reads a row's tokens from its left
            rows_tokens = {k: [tokens[k][i] for i in rows] for k in tokens.keys()}
            batch = tokenizer.pad(rows_tokens, padding_side="right", return_tensors="pt")
            batch = {k: v.to(device) for k, v in batch.items()}
            padded += batch["input_ids"].numel()
            states = model(**batch).last_hidden_state
            pooled = pool(states.float(), batch["attention_mask"], pooling).cpu().numpy()
            if out is None:
                out = np.empty((len(distinct), pooled.shape[1]), dtype=np.float32)
            out[rows] = pooled
    real = int(lengths.sum())
    log.info("encoded %d distinct texts of %d (pooling %s), %d padded tokens for %d real",
             len(distinct), len(texts), pooling.modes, padded, real)  # fmt: skip
    parameters = sum(p.numel() for p in model.parameters())
    return Encoded(out[where.reshape(-1)], pooling, parameters, backend_of(model), real, padded)


def split_embeddings(task: TaskSpec, rows: dict[str, pd.DataFrame], vectors: np.ndarray) -> dict[str, list[np.ndarray]]:
    """The embedding rows of ``encode_texts`` over every split's text fields back per split:
    split -> one (N, dim) array per text field."""
    out, at = {}, 0
    for name, frame in rows.items():
        fields = []
        for _ in task.text_fields:
            fields.append(vectors[at : at + len(frame)])
            at += len(frame)
        out[name] = fields
    return out


def all_texts(task: TaskSpec, rows: dict[str, pd.DataFrame]) -> list[str]:
    """Every text of every split, split by split and field by field (``split_embeddings``'s order)."""
    return [str(t) for frame in rows.values() for field in task.text_fields for t in frame[field]]


def feature_sets(fields: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The features a linear model may read, by name: one text, its embedding; a pair, SBERT's
    classification features [u, v, |u-v|, u*v] and the symmetric [|u-v|, u*v, cos] (the order of
    the two texts does not matter to them); the selection split chooses."""
    if len(fields) == 1:
        return {"u": fields[0]}
    u, v = fields
    return {
        "[u, v, |u-v|, u*v]": np.concatenate([u, v, np.abs(u - v), u * v], axis=1),
        "[|u-v|, u*v, cos]": np.concatenate([np.abs(u - v), u * v, cosine(fields)], axis=1),
    }


def cosine(fields: list[np.ndarray]) -> np.ndarray:
    """(N, 1): the cosine of each pair's two embeddings."""
    u, v = fields
    num = (u * v).sum(1)
    den = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)
    return (num / np.maximum(den, 1e-12)).reshape(-1, 1)


def linear_model(task: TaskSpec, strength: float):
    """LogisticRegression(C) or Ridge(alpha = 1 / C) on the features as they are: the embeddings
    are the backbone's own scale (unit length where it normalises), which standardising measured
    worse on MRPC's selection split."""
    from sklearn.linear_model import LogisticRegression, Ridge

    if task.kind == "regression":
        return Ridge(alpha=1.0 / strength)
    return LogisticRegression(C=strength, max_iter=5000)


def outputs_of(task: TaskSpec, model, features: np.ndarray) -> np.ndarray:
    """(N, C) outputs the registry's scorer reads: log-probabilities, or the regression value."""
    if task.kind == "regression":
        return model.predict(features).reshape(-1, 1)
    return in_label_columns(model.predict_proba(features), model.classes_, task.num_labels)


def in_label_columns(proba: np.ndarray, classes, num_labels: int) -> np.ndarray:
    """(N, num_labels) log-probabilities from a scikit-learn classifier's (N, len(classes)), whose
    columns are the classes its training rows held: a declared label with no training row has no
    column there, and every column after it would be read as the label before. Such a label gets
    a probability of 1e-12 (the log of 0 would be -inf)."""
    out = np.full((len(proba), num_labels), 1e-12)
    out[:, np.asarray(classes, dtype=int)] = np.clip(np.asarray(proba, dtype=np.float64), 1e-12, 1.0)
    return np.log(out)


def fit_on_selection(task: TaskSpec, features: dict[str, dict[str, np.ndarray]], labels: dict[str, np.ndarray],
                     strengths, scorer) -> tuple[object, dict, list[dict]]:  # fmt: skip
    """A linear model per feature set and strength, trained on train and scored on selection by
    ``scorer(outputs, split)`` (``features``: split -> feature set -> rows): (the best one, its
    entry of the choices tried, every choice tried with its selection score and fit seconds).
    Ties keep the earlier feature set and the stronger regularisation (the smaller C)."""
    tried, best = [], None
    for name in features["train"]:
        for strength in sorted(strengths):
            started = time.perf_counter()
            model = linear_model(task, strength).fit(features["train"][name], labels["train"])
            score = scorer(outputs_of(task, model, features["selection"][name]), "selection")
            choice = {"features": name, "regularization": strength}
            tried.append({**choice, "selection": score, "fit_seconds": time.perf_counter() - started})
            if best is None or score > best[2]:
                best = (model, tried[-1], score)
    return best[0], best[1], tried


def parameter_count(model) -> int:
    """The linear model's weights and intercepts."""
    return int(np.size(model.coef_) + np.size(model.intercept_))
