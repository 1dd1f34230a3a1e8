"""Classification / regression on per-example [CLS] features: training batches from memory (or
streamed from the shards when they do not fit), scoring, predictions and head + BERT ensembles."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch

from bertvision.errors import SettingsError
from bertvision.evaluation.ensemble import ensemble_examples, ensemble_rules, prediction_column
from bertvision.features.store import FeatureSet, read_shard
from bertvision.features.stream import BatchStream, Prefetched
from bertvision.features.streamed import is_streamed
from bertvision.layout import split_file
from bertvision.models.heads import fit_output
from bertvision.registry.metrics import predictions_from_outputs, score
from bertvision.registry.task_spec import TaskSpec
from bertvision.training.statistics import moments, nested_subset


class PermutedBatches:
    """One epoch of contiguous mini-batches over already-shuffled tensors."""

    def __init__(self, x, y, batch_size: int, wait_seconds: float):
        self.x, self.y, self.batch_size, self.wait_seconds = x, y, batch_size, wait_seconds

    def __iter__(self):
        for i in range(0, len(self.x), self.batch_size):
            yield self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]


class TrainingData:
    """Per-example training batches for every epoch.

    When the features fit in ``in_memory_max_mb`` (as float32) they are held on the training
    device, and a background thread prepares the next epoch's shuffled copy while the current
    epoch trains; otherwise they are streamed from the shards (``BatchStream``).
    """

    def __init__(self, features: FeatureSet, device: torch.device, in_memory_max_mb: float, rows=None):
        self.features, self.device = features, device
        layers, hidden = features.shape
        fp32_mb = features.n_examples * layers * hidden * 4 / 2**20
        self.in_memory = fp32_mb <= in_memory_max_mb
        if rows is not None and not self.in_memory:
            raise SettingsError(
                f"training on a subset of {features.manifest_path}'s rows needs the features in "
                f"memory ({fp32_mb:.0f} MiB > heads.training.in_memory_max_mb {in_memory_max_mb:g})"
            )
        if self.in_memory:
            x, y, _ = features.read_all()
            if rows is not None:
                x, y = x[rows], y[rows]
            self.x = torch.from_numpy(x.astype(np.float32)).to(device)
            self.y = torch.from_numpy(y).to(device)
            self._pool = ThreadPoolExecutor(max_workers=1)
            self._next: dict = {}

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-(layer, dimension) mean and std of the training features."""
        if self.in_memory:
            return self.x.mean(dim=0), self.x.std(dim=0)
        shards = (read_shard(p, self.features.reads)[0] for p in self.features.shard_paths())
        return moments(shards, self.features.n_examples, self.device)

    def train_labels(self) -> np.ndarray:
        return self.y.cpu().numpy() if self.in_memory else self.features.labels()

    def _shuffled(self, seed: int):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(seed)).to(self.device)
        return self.x[order], self.y[order]

    def __len__(self) -> int:
        return len(self.x) if self.in_memory else self.features.n_examples

    def epoch(self, seed: int, batch_size: int):
        """Batches for the epoch with shuffling ``seed``; the next call is expected with ``seed + 1``."""
        if not self.in_memory:
            return BatchStream(self.features, batch_size, seed=seed, pin_memory=self.device.type == "cuda")
        t0 = time.perf_counter()
        pending = self._next.pop(seed, None) or self._pool.submit(self._shuffled, seed)
        x, y = pending.result()
        wait = time.perf_counter() - t0
        self._next = {seed + 1: self._pool.submit(self._shuffled, seed + 1)}
        return PermutedBatches(x, y, batch_size, wait)


class StreamedBatches(Prefetched):
    """One epoch of (x, y) batches whose per-example states the frozen encoder computes, a couple of
    batches ahead in a background thread; ``wait_seconds``: the trainer's wait for them."""

    prefetch = 2

    def __init__(self, features, order: np.ndarray, batch_size: int):
        self.features, self.order, self.batch_size = features, order, batch_size
        self.wait_seconds = 0.0

    def produce(self):
        labels = self.features.tokens.labels
        for i in range(0, len(self.order), self.batch_size):
            rows = self.order[i : i + self.batch_size]
            yield self.features.example_batch(rows), torch.from_numpy(labels[rows])


class StreamedTrainingData:
    """Training batches of a streamed split (``store: false``): every epoch runs the encoder
    over the rows again, in the order ``TrainingData`` would draw them for the same seed."""

    in_memory = False

    def __init__(self, features, rows=None):
        self.features = features
        self.rows = np.arange(features.n_examples) if rows is None else np.asarray(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-(layer, dimension) mean and std of the training states (one encoder pass)."""
        batch = self.features.source.settings.batch_size
        chunks = (
            self.features.example_batch(self.rows[i : i + batch]).to("cpu", torch.float16).numpy()
            for i in range(0, len(self.rows), batch)
        )
        return moments(chunks, len(self.rows), self.features.encoder.device)

    def train_labels(self) -> np.ndarray:
        return self.features.tokens.labels[self.rows]

    def epoch(self, seed: int, batch_size: int):
        order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(seed)).numpy()
        return StreamedBatches(self.features, self.rows[order], batch_size)


def predict_arrays(head, x: np.ndarray, device, batch_size: int = 1024) -> np.ndarray:
    head.eval()
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            xb = torch.from_numpy(x[i : i + batch_size].astype(np.float32)).to(device)
            outs.append(head(xb).float().cpu().numpy())
    return np.concatenate(outs)


def held_questions(task: TaskSpec, raw_dir, splits) -> dict[str, pd.DataFrame]:
    """The raw rows of the held-out ``splits`` of an answerability task (each question's gold
    label comes from them, not from its windows); no rows for other tasks."""
    if not task.answerability:
        return {}
    if raw_dir is None:
        raise SettingsError(f"{task.name}: scoring answerability needs the task's raw splits (--raw-dir)")
    return {split: pd.read_parquet(split_file(raw_dir, split)) for split in splits if split != "train"}


class ExampleProblem:
    """Classification / regression on per-example [CLS] features. ``train_fraction`` < 1 trains
    on a nested random subset of the training rows (data-fraction experiments)."""

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
        rows = nested_subset(feats["train"].n_examples, train_fraction)
        self.data = (
            StreamedTrainingData(feats["train"], rows)
            if is_streamed(feats["train"])
            else TrainingData(feats["train"], device, in_memory_max_mb, rows)
        )
        self.n_train = len(self.data)
        self.held = {split: fs.read_all() for split, fs in feats.items() if split != "train"}
        self.questions = held_questions(task, raw_dir, self.held)
        self.data_in_memory = self.data.in_memory

    def moments(self):
        return self.data.moments()

    def train_labels(self) -> np.ndarray:
        return self.data.train_labels()

    def epoch(self, seed: int, batch_size: int):
        return self.data.epoch(seed, batch_size)

    def loss(self, head, batch) -> torch.Tensor:
        x, y = (t.to(self.device, non_blocking=True) for t in batch)
        return self.output_loss(head(x), y)

    def fit_output(self, head, batch) -> None:
        x, y = (t.to(self.device, non_blocking=True) for t in batch)
        fit_output(head, x, y, self.task.num_labels)

    def output_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """MSE for regression, cross-entropy for classification."""
        if self.task.kind == "regression":
            return torch.nn.functional.mse_loss(out[:, 0], y.float())
        return torch.nn.functional.cross_entropy(out, y.long())

    def _score(self, head, split: str) -> tuple[dict, np.ndarray]:
        x, y, idx = self.held[split]
        outputs = predict_arrays(head, x, self.device)
        return score(self.task, outputs, y, idx, self.questions.get(split)), outputs

    def selection_metrics(self, head) -> dict:
        return self._score(head, "selection")[0]

    def evaluate(self, head, bert_logits=None) -> tuple[dict, pd.DataFrame, dict]:
        metrics, tables, ensembles = {}, [], {}
        hows = ensemble_rules(self.task)
        for split in ("selection", *self.task.eval_splits):  # selection: for choices made downstream
            metrics[split], outputs = self._score(head, split)
            _, labels, idx = self.held[split]
            table = {"split": split, "idx": idx, "label": labels}
            table[prediction_column()] = predictions_from_outputs(outputs, self.task.kind)
            table["outputs"] = list(outputs)
            if bert_logits is not None and split in bert_logits:  # checkpoints from before selection was scored lack it
                bert = np.concatenate(bert_logits[split])
                for how in hows:
                    combined = ensemble_examples(outputs, bert, how, self.task.kind)
                    ensembles.setdefault(how, {})[split] = score(
                        self.task, combined, labels, idx, self.questions.get(split)
                    )
                    table[prediction_column(how)] = predictions_from_outputs(combined, self.task.kind)
            if split != "selection":
                tables.append(pd.DataFrame(table))
        return metrics, pd.concat(tables, ignore_index=True), ensembles
