"""Question answering on per-token features of context windows: start/end logits per token,
padding masked out, answers decoded per question and scored with SQuAD 2.0 EM/F1."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from bertvision.data.tokenized import shuffled_batches
from bertvision.evaluation.ensemble import ensemble_rules, ensemble_windows
from bertvision.evaluation.span_eval import best_selection_f1, evaluate_span
from bertvision.features.store import FeatureSet, WindowStates
from bertvision.features.stream import WindowBatches
from bertvision.features.token_reader import token_windows
from bertvision.layout import split_file
from bertvision.models.heads import span_logits
from bertvision.registry.task_spec import TaskSpec
from bertvision.training.statistics import nested_subset, token_moments

INFERENCE_ROWS = 64  # windows per inference batch


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
        lazy: bool = False,
    ):
        """``lazy``: read every stored split from the shards, however small (``token_windows``)."""
        self.task, self.device = task, device
        self.shape = feats["train"].shape
        # Stored: in memory while they fit, else read in bounded buffers. Streamed: the training
        # windows are recomputed every epoch, the others held in memory when they fit.
        self.windows = token_windows(feats, in_memory_max_mb, lazy)
        questions = np.unique(self.windows["train"].idx)
        keep = nested_subset(len(questions), train_fraction)
        if keep is not None:  # whole questions, with all their windows
            self.windows["train"] = self.windows["train"].subset(
                np.flatnonzero(np.isin(self.windows["train"].idx, questions[keep]))
            )
        self.n_train = len(self.windows["train"])
        self.questions = {split: pd.read_parquet(split_file(raw_dir, split)) for split in feats}
        self.data_in_memory = isinstance(self.windows["train"], WindowStates)

    def moments(self):
        return token_moments(self.windows["train"], self.device)

    def epoch(self, seed: int, batch_size: int):
        return WindowBatches(self.windows["train"], batch_size, seed, shuffled_batches)

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
        longest = int(windows.lengths.max(initial=1))
        head.eval()
        with torch.inference_mode():
            for rows, x, mask in windows.inference_batches(INFERENCE_ROWS * longest, INFERENCE_ROWS):
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
