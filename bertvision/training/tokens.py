"""Classification / regression from every real token of each example (token-level heads such as
``token-pool``), for tasks extracted with ``token_features``.

The features are the ragged token shards (one "window" per example), held in memory when they
fit in ``heads.training.in_memory_max_mb`` and read from the shards in bounded buffers
otherwise (``features.token_reader``). Training batches are padded per batch, with a mask,
from length-bucketed rows so padding stays small; they are assembled in a background thread.
Scoring, predictions and the head + BERT ensembles are ExampleProblem's: only how the head's
outputs are computed differs.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from bertvision.data.tokenized import bucketed_batches
from bertvision.errors import FeatureError
from bertvision.features.store import FeatureSet, WindowStates
from bertvision.features.stream import WindowBatches
from bertvision.features.streamed import is_streamed
from bertvision.features.token_reader import token_windows
from bertvision.registry.metrics import score
from bertvision.registry.task_spec import TaskSpec
from bertvision.training.example import ExampleProblem, held_questions
from bertvision.training.statistics import nested_subset, token_moments

log = logging.getLogger(__name__)


def predict_tokens(head, examples, device, max_tokens: int = 4096) -> np.ndarray:
    """(N, outputs) head outputs in row order, from length-sorted batches of at most
    ``max_tokens`` padded tokens."""
    head.eval()
    outputs: np.ndarray | None = None
    with torch.inference_mode():
        for rows, x, mask in examples.inference_batches(max_tokens):
            out = head(x.to(device), mask.to(device)).float().cpu().numpy()
            if outputs is None:
                outputs = np.empty((len(examples), out.shape[1]), dtype=np.float32)
            outputs[rows] = out
    return outputs if outputs is not None else np.zeros((0, 0), np.float32)


class TokenExampleProblem(ExampleProblem):
    """Per-example classification / regression whose head sees every real token: (x, mask, y)
    batches, CE or MSE loss, and ExampleProblem's selection metrics, evaluation, predictions and
    ensembles (``self.held[split]`` = (examples, labels, idx), ``_score`` from token outputs).
    ``moments``: per-(layer, dimension) mean and std over every real training token."""

    def __init__(
        self,
        task: TaskSpec,
        feats: dict[str, FeatureSet],
        device,
        in_memory_max_mb: float,
        raw_dir=None,
        train_fraction: float = 1.0,
        lazy: bool = False,
    ):
        """``lazy``: read every stored split from the shards, however small (``token_windows``)."""
        if task.kind not in ("classification", "regression"):
            raise ValueError(f"{task.name}: token-level example heads need a classification or regression task")
        if feats["train"].feature != "tokens":
            raise FeatureError(
                f"{feats['train'].manifest_path}: {task.name} was extracted with [CLS] features only; "
                f"token-level heads need tasks.{task.name}.token_features: true"
            )
        self.task, self.device = task, device
        self.shape = feats["train"].shape
        examples = token_windows(feats, in_memory_max_mb, lazy)
        rows = nested_subset(len(examples["train"]), train_fraction)
        self.train = examples["train"] if rows is None else examples["train"].subset(rows)
        self.n_train = len(self.train)
        self.held = {split: (ex, ex.labels, ex.idx) for split, ex in examples.items() if split != "train"}
        self.questions = held_questions(task, raw_dir, self.held)
        self.data_in_memory = isinstance(self.train, WindowStates)
        tokens = int(self.train.lengths.sum())
        log.info(
            "%s: token features of %d training examples (%d tokens, %.1f MiB as float16) %s",
            task.name,
            self.n_train,
            tokens,
            tokens * self.shape[0] * self.shape[1] * 2 / 2**20,
            "in memory"
            if self.data_in_memory
            else "streamed from the encoder"
            if is_streamed(feats["train"])
            else f"read from the shards in buffers of at most {in_memory_max_mb:g} MiB",
        )

    def moments(self):
        return token_moments(self.train, self.device)

    def train_labels(self) -> np.ndarray:
        return self.train.labels

    def epoch(self, seed: int, batch_size: int):
        return WindowBatches(self.train, batch_size, seed, bucketed_batches)

    def loss(self, head, batch) -> torch.Tensor:
        x, mask, y = (t.to(self.device, non_blocking=True) for t in batch)
        return self.output_loss(head(x, mask), y)

    def _score(self, head, split: str) -> tuple[dict, np.ndarray]:
        examples, labels, idx = self.held[split]
        outputs = predict_tokens(head, examples, self.device)
        return score(self.task, outputs, labels, idx, self.questions.get(split)), outputs
