"""Question answering on per-token features of context windows: start/end logits per token,
padding masked out, answers decoded per question and scored with SQuAD 2.0 EM/F1."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from bertvision.evaluation.ensemble import ensemble_rules, ensemble_windows
from bertvision.evaluation.span_eval import best_selection_f1, evaluate_span
from bertvision.features.store import FeatureSet
from bertvision.features.stream import Prefetched
from bertvision.features.streamed import windows_of
from bertvision.layout import split_file
from bertvision.models.heads import span_logits
from bertvision.registry.tasks import TaskSpec
from bertvision.training.statistics import nested_subset, token_moments
from bertvision.training.windows import select_windows


class SpanBatches(Prefetched):
    """One epoch of padded window batches (x (B, T, L, H), mask (B, T), labels (B, 2)),
    assembled by a background thread; ``wait_seconds`` is the time the trainer waited."""

    prefetch = 4

    def __init__(self, windows, batch_size: int, seed: int):
        self.windows, self.batch_size = windows, batch_size
        self.order = np.random.default_rng(seed).permutation(len(windows))
        self.wait_seconds = 0.0

    def produce(self):
        for i in range(0, len(self.order), self.batch_size):
            yield self.windows.padded(self.order[i : i + self.batch_size])


class SpanProblem:
    """Question answering on per-token features of context windows: start/end logits per
    token, padding masked out, answers decoded per question and scored with SQuAD 2.0 EM/F1."""

    def __init__(
        self,
        task: TaskSpec,
        feats: dict[str, FeatureSet],
        device,
        in_memory_max_mb: float,
        raw_dir=None,
        train_fraction: float = 1.0,
    ):
        self.task, self.device = task, device
        self.shape = feats["train"].shape
        # Stored: every split in memory. Streamed: the training windows are recomputed every epoch,
        # the others held in memory when they fit.
        self.windows = {
            split: windows_of(fs, None if split == "train" else in_memory_max_mb) for split, fs in feats.items()
        }
        questions = np.unique(self.windows["train"].idx)
        keep = nested_subset(len(questions), train_fraction)
        if keep is not None:  # whole questions, with all their windows
            self.windows["train"] = select_windows(
                self.windows["train"], np.flatnonzero(np.isin(self.windows["train"].idx, questions[keep]))
            )
        self.n_train = len(self.windows["train"])
        self.questions = {split: pd.read_parquet(split_file(raw_dir, split)) for split in feats}
        self.data_in_memory = True

    def moments(self):
        return token_moments(self.windows["train"], self.device)

    def epoch(self, seed: int, batch_size: int):
        return SpanBatches(self.windows["train"], batch_size, seed)

    def loss(self, head, batch) -> torch.Tensor:
        x, mask, y = (t.to(self.device, non_blocking=True) for t in batch)
        logits = span_logits(head, x, mask).float()
        return (
            torch.nn.functional.cross_entropy(logits[..., 0], y[:, 0])
            + torch.nn.functional.cross_entropy(logits[..., 1], y[:, 1])
        ) / 2

    def window_logits(self, head, split: str) -> list[np.ndarray]:
        windows = self.windows[split]
        out: list = [None] * len(windows)
        order = np.argsort(windows.lengths, kind="stable")
        head.eval()
        with torch.inference_mode():
            for i in range(0, len(order), 64):
                rows = order[i : i + 64]
                x, mask, _ = windows.padded(rows)
                logits = span_logits(head, x.to(self.device), mask.to(self.device)).float().cpu().numpy()
                for j, r in enumerate(rows):
                    out[r] = logits[j, : windows.lengths[r]]
        return out

    def selection_metrics(self, head) -> dict:
        return best_selection_f1(
            self.task, self.window_logits(head, "selection"), self.windows["selection"], self.questions["selection"]
        )

    def evaluate(self, head, bert_logits=None) -> tuple[dict, pd.DataFrame, dict]:
        """Metrics, predictions and (given BERT's window logits) the ensembles' metrics; every
        model, ensembles included, gets its null threshold tuned on the selection split."""
        splits = ("selection", *self.task.eval_splits)
        logits = {s: self.window_logits(head, s) for s in splits}
        windows, questions = {s: self.windows[s] for s in splits}, {s: self.questions[s] for s in splits}
        metrics, predictions = evaluate_span(self.task, logits, windows, questions)
        ensembles = {}
        if bert_logits is not None:
            for how in ensemble_rules(self.task):
                combined = {s: ensemble_windows(logits[s], bert_logits[s], how) for s in splits}
                ensembles[how] = evaluate_span(self.task, combined, windows, questions)[0]
        return metrics, predictions, ensembles
