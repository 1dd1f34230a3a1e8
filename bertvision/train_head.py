"""The ``train_heads`` stage: train every configured head architecture on one checkpoint's
features, for each seed. The number of epochs is chosen on the selection split (early
stopping, best epoch restored); the evaluation splits are only ever scored, never used for a
choice. One job per checkpoint: the features are read and verified once for all heads.

What differs between task kinds lives in a "problem": per-example [CLS] features
(classification, regression) or per-token features of context windows (span).
"""

from __future__ import annotations

import copy
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from bertvision.device import pick_device, set_threads
from bertvision.ensemble import ENSEMBLES, ensemble_examples, ensemble_windows, load_logits
from bertvision.features import BatchStream, FeatureSet, Prefetched, WindowStates, read_shard
from bertvision.heads import ScalarMixHead, Standardized, build_head, count_parameters, is_token_head
from bertvision.io import atomic_path, atomic_write_json, atomic_write_parquet
from bertvision.metrics import compute_metrics, predictions_from_outputs
from bertvision.tasks import TaskSpec, splits_of

log = logging.getLogger(__name__)


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
            raise ValueError(f"training on a subset of {features.manifest_path}'s rows needs the features in "
                             f"memory ({fp32_mb:.0f} MiB > heads.training.in_memory_max_mb {in_memory_max_mb:g})")
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
        return _moments((read_shard(p)[0] for p in self.features.shard_paths()), self.features.n_examples,
                        self.device)

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


def _moments(chunks, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sample std over the first axis of float16 chunks, accumulated in float64."""
    total = total_sq = 0.0
    for chunk in chunks:
        for i in range(0, len(chunk), 65536):
            x = chunk[i : i + 65536].astype(np.float64)
            total = total + x.sum(0)
            total_sq = total_sq + (x * x).sum(0)
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1))
    return (torch.from_numpy(mean.astype(np.float32)).to(device), torch.from_numpy(std.astype(np.float32)).to(device))


def predict_arrays(head, x: np.ndarray, device, batch_size: int = 1024) -> np.ndarray:
    head.eval()
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            xb = torch.from_numpy(x[i : i + batch_size].astype(np.float32)).to(device)
            outs.append(head(xb).float().cpu().numpy())
    return np.concatenate(outs)


def nested_subset(n: int, fraction: float, seed: int = 0) -> np.ndarray | None:
    """Sorted rows of a seeded ``fraction`` of ``range(n)`` (None = all). Smaller fractions are
    subsets of larger ones, so a data-fraction curve adds data rather than redrawing it."""
    if fraction >= 1.0:
        return None
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[: max(1, int(round(fraction * n)))])


class ExampleProblem:
    """Classification / regression on per-example [CLS] features. ``train_fraction`` < 1 trains
    on a nested random subset of the training rows (data-fraction experiments)."""

    def __init__(self, task: TaskSpec, feats: dict[str, FeatureSet], settings: dict, device, raw_dir=None,
                 train_fraction: float = 1.0):
        self.task, self.device = task, device
        self.shape = feats["train"].shape
        rows = nested_subset(feats["train"].n_examples, train_fraction)
        self.data = TrainingData(feats["train"], device, float(settings["in_memory_max_mb"]), rows)
        self.n_train = len(self.data)
        self.held = {split: fs.read_all() for split, fs in feats.items() if split != "train"}
        self.data_in_memory = self.data.in_memory

    def moments(self):
        return self.data.moments()

    def epoch(self, seed: int, batch_size: int):
        return self.data.epoch(seed, batch_size)

    def loss(self, head, batch) -> torch.Tensor:
        x, y = (t.to(self.device, non_blocking=True) for t in batch)
        return self.output_loss(head(x), y)

    def output_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """MSE for regression, cross-entropy for classification."""
        if self.task.kind == "regression":
            return torch.nn.functional.mse_loss(out[:, 0], y.float())
        return torch.nn.functional.cross_entropy(out, y.long())

    def _score(self, head, split: str) -> tuple[dict, np.ndarray]:
        x, y, _ = self.held[split]
        outputs = predict_arrays(head, x, self.device)
        return compute_metrics(self.task.metrics, predictions_from_outputs(outputs, self.task.kind), y), outputs

    def selection_metrics(self, head) -> dict:
        return self._score(head, "selection")[0]

    def evaluate(self, head, bert_logits=None) -> tuple[dict, pd.DataFrame, dict]:
        metrics, tables, ensembles = {}, [], {}
        hows = ("mean",) if self.task.kind == "regression" else ENSEMBLES
        for split in self.task.eval_splits:
            metrics[split], outputs = self._score(head, split)
            _, labels, idx = self.held[split]
            tables.append(pd.DataFrame({
                "split": split, "idx": idx, "label": labels,
                "prediction": predictions_from_outputs(outputs, self.task.kind), "outputs": list(outputs),
            }))
            if bert_logits is not None:
                bert = np.concatenate(bert_logits[split])
                for how in hows:
                    combined = ensemble_examples(outputs, bert, how, self.task.kind)
                    ensembles.setdefault(how, {})[split] = compute_metrics(
                        self.task.metrics, predictions_from_outputs(combined, self.task.kind), labels)
        return metrics, pd.concat(tables, ignore_index=True), ensembles


class SpanBatches(Prefetched):
    """One epoch of padded window batches (x (B, T, L, H), mask (B, T), labels (B, 2)),
    assembled by a background thread; ``wait_seconds`` is the time the trainer waited."""

    prefetch = 4

    def __init__(self, windows: WindowStates, batch_size: int, seed: int):
        self.windows, self.batch_size = windows, batch_size
        self.order = np.random.default_rng(seed).permutation(len(windows))
        self.wait_seconds = 0.0

    def produce(self):
        for i in range(0, len(self.order), self.batch_size):
            yield pad_windows(self.windows, self.order[i : i + self.batch_size])


def select_windows(windows: WindowStates, rows: np.ndarray) -> WindowStates:
    """The windows ``rows`` (in that order) of ``windows``, as a new WindowStates."""
    slices = [windows.window(i) for i in rows]
    offsets = np.concatenate([[0], np.cumsum([s.stop - s.start for s in slices])]).astype(np.int64)
    take = np.concatenate([np.arange(s.start, s.stop) for s in slices]) if len(rows) else np.zeros(0, np.int64)
    char_offsets = None if windows.char_offsets is None else windows.char_offsets[take]
    return WindowStates(windows.states[take], offsets, char_offsets, windows.labels[rows], windows.idx[rows])


def pad_windows(windows: WindowStates, rows: np.ndarray):
    lengths = windows.lengths[rows]
    width = int(lengths.max())
    layers, hidden = windows.states.shape[1:]
    x = np.zeros((len(rows), width, layers, hidden), dtype=np.float32)
    mask = np.zeros((len(rows), width), dtype=bool)
    for j, i in enumerate(rows):
        x[j, : lengths[j]] = windows.states[windows.window(i)]
        mask[j, : lengths[j]] = True
    return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(windows.labels[rows])


class SpanProblem:
    """Question answering on per-token features of context windows: start/end logits per
    token, padding masked out, answers decoded per question and scored with SQuAD 2.0 EM/F1."""

    def __init__(self, task: TaskSpec, feats: dict[str, FeatureSet], settings: dict, device, raw_dir=None,
                 train_fraction: float = 1.0):
        self.task, self.device = task, device
        self.shape = feats["train"].shape
        self.windows = {split: fs.read_windows() for split, fs in feats.items()}
        questions = np.unique(self.windows["train"].idx)
        keep = nested_subset(len(questions), train_fraction)
        if keep is not None:  # whole questions, with all their windows
            self.windows["train"] = select_windows(self.windows["train"],
                                                   np.flatnonzero(np.isin(self.windows["train"].idx, questions[keep])))
        self.n_train = len(self.windows["train"])
        self.questions = {split: pd.read_parquet(Path(raw_dir) / f"{split}.parquet") for split in feats}
        self.data_in_memory = True

    def moments(self):
        train = self.windows["train"]
        return _moments([train.states], len(train.states), self.device)

    def epoch(self, seed: int, batch_size: int):
        return SpanBatches(self.windows["train"], batch_size, seed)

    def loss(self, head, batch) -> torch.Tensor:
        x, mask, y = (t.to(self.device, non_blocking=True) for t in batch)
        logits = head(x).masked_fill(~mask[..., None], -1e4)
        return (torch.nn.functional.cross_entropy(logits[..., 0], y[:, 0])
                + torch.nn.functional.cross_entropy(logits[..., 1], y[:, 1])) / 2

    def window_logits(self, head, split: str) -> list[np.ndarray]:
        windows = self.windows[split]
        out: list = [None] * len(windows)
        order = np.argsort(windows.lengths, kind="stable")
        head.eval()
        with torch.inference_mode():
            for i in range(0, len(order), 64):
                rows = order[i : i + 64]
                x, _, _ = pad_windows(windows, rows)
                logits = head(x.to(self.device)).float().cpu().numpy()
                for j, r in enumerate(rows):
                    out[r] = logits[j, : windows.lengths[r]]
        return out

    def selection_metrics(self, head) -> dict:
        from bertvision.span_eval import best_selection_f1

        return best_selection_f1(self.task, self.window_logits(head, "selection"), self.windows["selection"],
                                 self.questions["selection"])

    def evaluate(self, head, bert_logits=None) -> tuple[dict, pd.DataFrame, dict]:
        """Metrics, predictions and (given BERT's window logits) the ensembles' metrics; every
        model, ensembles included, gets its null threshold tuned on the selection split."""
        from bertvision.span_eval import evaluate_span

        splits = ("selection", *self.task.eval_splits)
        logits = {s: self.window_logits(head, s) for s in splits}
        windows, questions = {s: self.windows[s] for s in splits}, {s: self.questions[s] for s in splits}
        metrics, predictions = evaluate_span(self.task, logits, windows, questions)
        ensembles = {}
        if bert_logits is not None:
            for how in ENSEMBLES:
                combined = {s: ensemble_windows(logits[s], bert_logits[s], how) for s in splits}
                ensembles[how] = evaluate_span(self.task, combined, windows, questions)[0]
        return metrics, predictions, ensembles


PROBLEMS = {"classification": ExampleProblem, "regression": ExampleProblem, "span": SpanProblem}


def problem_class(task: TaskSpec, spec: dict):
    """The problem head ``spec`` trains on: token-level heads of example tasks on every real
    token (``TokenExampleProblem``), the others by task kind (``PROBLEMS``)."""
    if is_token_head(spec) and task.kind != "span":
        from bertvision.token_problem import TokenExampleProblem

        return TokenExampleProblem
    return PROBLEMS[task.kind]


class Problems:
    """The training problems over one checkpoint's features, one per problem class (per-example
    [CLS], token-level, span), each built (and its input moments computed) when a head first
    needs it. ``settings``: the head training settings (device, verify, in_memory_max_mb)."""

    def __init__(self, task: TaskSpec, manifest: Path, settings: dict, raw_dir=None, train_fraction: float = 1.0):
        self.task, self.settings, self.raw_dir, self.train_fraction = task, settings, raw_dir, train_fraction
        self.device = pick_device(settings["device"])
        self.feats = {split: FeatureSet.open(manifest, split, verify=settings["verify"]) for split in splits_of(task)}
        self._problems: dict = {}
        self._moments: dict = {}

    def get(self, spec: dict):
        cls = problem_class(self.task, spec)
        if cls not in self._problems:
            self._problems[cls] = cls(self.task, self.feats, self.settings, self.device, self.raw_dir,
                                      self.train_fraction)
        return self._problems[cls]

    def moments(self, spec: dict):
        """(mean, std) of the training features ``spec``'s problem sees."""
        cls = problem_class(self.task, spec)
        if cls not in self._moments:
            self._moments[cls] = self.get(spec).moments()
        return self._moments[cls]


def train_one(task: TaskSpec, spec: dict, settings: dict, problem, seed: int, device, moments=None,
              on_epoch=None):
    """Train one head with one seed; return it with the best epoch (by selection score) restored.
    ``moments``: (mean, std) of the training features to standardize the input with, or None.
    ``on_epoch(epoch, selection_score)`` is called after each epoch (the search prunes there)."""
    torch.manual_seed(seed)
    layers, hidden = problem.shape
    head = build_head(spec, layers, hidden, task.num_labels)
    if moments is not None:
        head = Standardized(head, *moments)
    head = head.to(device)
    max_epochs = int(settings["max_epochs"])
    batch_size = int(settings["batch_size"])
    total = max_epochs * -(-problem.n_train // batch_size)
    warmup = int(round(float(settings["warmup_ratio"]) * total))
    opt = torch.optim.AdamW(head.parameters(), lr=float(settings["learning_rate"]),
                            weight_decay=float(settings["weight_decay"]))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    best = {"score": -np.inf, "epoch": 0, "state": copy.deepcopy(head.state_dict()), "metrics": None}
    history, wait, loop_seconds, stale = [], 0.0, 0.0, 0
    for epoch in range(1, max_epochs + 1):
        batches = problem.epoch(seed * 1000 + epoch, batch_size)
        head.train()
        t0 = time.perf_counter()
        losses = []
        for batch in batches:
            loss = problem.loss(head, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
        loop_seconds += time.perf_counter() - t0
        wait += batches.wait_seconds
        sel_metrics = problem.selection_metrics(head)
        history.append({"epoch": epoch, "train_loss": float(torch.stack(losses).mean()), "selection": sel_metrics})
        if sel_metrics[task.primary_metric] > best["score"]:
            best = {"score": sel_metrics[task.primary_metric], "epoch": epoch,
                    "state": copy.deepcopy(head.state_dict()), "metrics": sel_metrics}
            stale = 0
        else:
            stale += 1
            if stale >= int(settings["patience"]):
                break
        if on_epoch is not None:
            on_epoch(epoch, sel_metrics[task.primary_metric])
    head.load_state_dict(best["state"])
    timing = {"train_loop_seconds": loop_seconds, "data_wait_seconds": wait,
              "data_wait_share": wait / loop_seconds if loop_seconds else 0.0}
    return head, best, history, timing


def save_head(head, head_name: str, spec: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "head.safetensors") as tmp:
        save_file({k: v.contiguous().cpu() for k, v in head.state_dict().items()}, str(tmp),
                  metadata={"head": head_name, "type": spec["type"]})


def train_heads(
    task: TaskSpec,
    heads: dict[str, dict],
    settings: dict,
    manifest: Path,
    seeds: list[int],
    out_root: Path,
    threads: int | None = None,
    raw_dir: Path | None = None,
    bert_logits: Path | None = None,
    searched: dict[str, Path] | None = None,
    train_fraction: float = 1.0,
) -> None:
    """Write ``{out_root}/{head}/seed{seed}/`` (weights, eval predictions, metrics) for every
    head and seed. ``manifest``: the checkpoint's feature manifest; ``raw_dir``: the task's
    canonical splits (span tasks decode answers from their contexts); ``bert_logits``: BERT's
    ``eval_logits.npz`` at the same checkpoint, for the head + BERT ensembles; ``searched``:
    head name -> its study's ``best.json``, whose parameters replace the configured ones;
    ``train_fraction``: train on that nested share of the training rows."""
    from bertvision.search import tuned

    searched = searched or {}
    set_threads(threads)
    problems = Problems(task, manifest, settings, raw_dir, train_fraction)
    device = problems.device
    bert = load_logits(bert_logits) if bert_logits else None
    source = problems.feats["train"].manifest["source"]
    encoder_params = problems.feats["train"].manifest["encoder_parameters"]
    for head_name, configured in heads.items():
        spec, head_settings, search = tuned(configured, settings, searched.get(head_name))
        problem = problems.get(spec)
        moments = problems.moments(spec) if settings["standardize"] else None
        for seed in seeds:
            t0 = time.perf_counter()
            head, best, history, timing = train_one(task, spec, head_settings, problem, seed, device, moments)
            metrics, predictions, ensembles = problem.evaluate(head, bert)
            out = Path(out_root) / head_name / f"seed{seed}"
            save_head(head, head_name, spec, out)
            atomic_write_parquet(predictions, out / "eval_predictions.parquet")
            params = count_parameters(head)
            record = {
                "task": task.name, "head": head_name, "head_spec": spec, "seed": seed, "source": source,
                "parameters": params, "encoder_parameters": encoder_params,
                "parameter_percent": 100.0 * params / encoder_params,
                "train_fraction": train_fraction, "train_examples": problem.n_train,
                "training_settings": {k: head_settings[k] for k in ("learning_rate", "batch_size", "max_epochs",
                                                                   "weight_decay")},
                "search": None if search is None else {k: search[k] for k in (
                    "study", "best_params", "best_value", "trials")},
                "best_epoch": best["epoch"], "selection_metrics": best["metrics"], "metrics": metrics,
                "ensembles": ensembles,
                "history": history, "seconds": time.perf_counter() - t0, **timing,
                "data_in_memory": problem.data_in_memory, "device": str(device),
            }
            core = head.head if isinstance(head, Standardized) else head
            if isinstance(core, ScalarMixHead) or is_token_head(spec):
                record["layer_weights"] = core.layer_weights().detach().cpu().tolist()
                record["gamma"] = float(core.gamma.detach())
            atomic_write_json(record, out / "metrics.json")
            log.info("%s %s seed %d: best epoch %d, eval %s, data wait %.2f%%", task.name, head_name, seed,
                     best["epoch"], {s: {k: round(v, 4) for k, v in m.items() if k in task.metrics}
                                     for s, m in metrics.items() if s in task.eval_splits},
                     100 * timing["data_wait_share"])
