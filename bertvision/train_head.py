"""The ``train_heads`` stage: train every configured head architecture on one checkpoint's
features, for each seed. The number of epochs is chosen on the selection split (early
stopping, best epoch restored); the evaluation splits are only ever scored, never used for a
choice. One job per checkpoint: the features are read and verified once for all heads."""

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
from bertvision.features import BatchStream, FeatureSet, read_shard
from bertvision.heads import ScalarMixHead, Standardized, build_head, count_parameters
from bertvision.io import atomic_path, atomic_write_json, atomic_write_parquet
from bertvision.metrics import compute_metrics, predictions_from_outputs
from bertvision.tasks import TaskSpec, splits_of

log = logging.getLogger(__name__)


def loss_fn(kind: str):
    if kind == "regression":
        return lambda out, y: torch.nn.functional.mse_loss(out[:, 0], y.float())
    return lambda out, y: torch.nn.functional.cross_entropy(out, y.long())


class PermutedBatches:
    """One epoch of contiguous mini-batches over already-shuffled tensors."""

    def __init__(self, x, y, batch_size: int, wait_seconds: float):
        self.x, self.y, self.batch_size, self.wait_seconds = x, y, batch_size, wait_seconds

    def __iter__(self):
        for i in range(0, len(self.x), self.batch_size):
            yield self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]


class TrainingData:
    """Training batches for every epoch.

    When the features fit in ``in_memory_max_mb`` (as float32) they are held on the training
    device, and a background thread prepares the next epoch's shuffled copy while the current
    epoch trains; otherwise they are streamed from the shards (``BatchStream``).
    """

    def __init__(self, features: FeatureSet, batch_size: int, device: torch.device, in_memory_max_mb: float):
        self.features, self.batch_size, self.device = features, batch_size, device
        layers, hidden = features.shape
        fp32_mb = features.n_examples * layers * hidden * 4 / 2**20
        self.in_memory = fp32_mb <= in_memory_max_mb
        if self.in_memory:
            x, y, _ = features.read_all()
            self.x = torch.from_numpy(x.astype(np.float32)).to(device)
            self.y = torch.from_numpy(y).to(device)
            self._pool = ThreadPoolExecutor(max_workers=1)
            self._next: dict = {}

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-(layer, dimension) mean and std of the training features."""
        if self.in_memory:
            return self.x.mean(dim=0), self.x.std(dim=0)
        total = total_sq = None
        for path in self.features.shard_paths():
            x, _, _ = read_shard(path)
            x = x.astype(np.float64)
            total = x.sum(0) if total is None else total + x.sum(0)
            total_sq = (x * x).sum(0) if total_sq is None else total_sq + (x * x).sum(0)
        n = self.features.n_examples
        mean = total / n
        std = np.sqrt(np.maximum(total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1))
        return (torch.from_numpy(mean.astype(np.float32)).to(self.device),
                torch.from_numpy(std.astype(np.float32)).to(self.device))

    def _shuffled(self, seed: int):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(seed)).to(self.device)
        return self.x[order], self.y[order]

    def epoch(self, seed: int):
        """Batches for the epoch with shuffling ``seed``; the next call is expected with ``seed + 1``."""
        if not self.in_memory:
            return BatchStream(self.features, self.batch_size, seed=seed, pin_memory=self.device.type == "cuda")
        t0 = time.perf_counter()
        pending = self._next.pop(seed, None) or self._pool.submit(self._shuffled, seed)
        x, y = pending.result()
        wait = time.perf_counter() - t0
        self._next = {seed + 1: self._pool.submit(self._shuffled, seed + 1)}
        return PermutedBatches(x, y, self.batch_size, wait)


def predict_arrays(head, x: np.ndarray, device, batch_size: int = 1024) -> np.ndarray:
    head.eval()
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            xb = torch.from_numpy(x[i : i + batch_size].astype(np.float32)).to(device)
            outs.append(head(xb).float().cpu().numpy())
    return np.concatenate(outs)


def score(head, data, task: TaskSpec, device) -> tuple[dict, np.ndarray]:
    x, y, _ = data
    outputs = predict_arrays(head, x, device)
    return compute_metrics(task.metrics, predictions_from_outputs(outputs, task.kind), y), outputs


def train_one(task: TaskSpec, spec: dict, settings: dict, data: TrainingData, selection, seed: int, device,
              moments=None):
    """Train one head with one seed; return it with the best epoch (by selection score) restored.
    ``moments``: (mean, std) of the training features to standardize the input with, or None."""
    torch.manual_seed(seed)
    layers, hidden = data.features.shape
    head = build_head(spec, layers, hidden, task.num_labels)
    if moments is not None:
        head = Standardized(head, *moments)
    head = head.to(device)
    max_epochs = int(settings["max_epochs"])
    total = max_epochs * -(-data.features.n_examples // data.batch_size)
    warmup = int(round(float(settings["warmup_ratio"]) * total))
    opt = torch.optim.AdamW(head.parameters(), lr=float(settings["learning_rate"]),
                            weight_decay=float(settings["weight_decay"]))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    criterion = loss_fn(task.kind)
    best = {"score": -np.inf, "epoch": 0, "state": copy.deepcopy(head.state_dict()), "metrics": None}
    history, wait, loop_seconds, stale = [], 0.0, 0.0, 0
    for epoch in range(1, max_epochs + 1):
        batches = data.epoch(seed * 1000 + epoch)
        head.train()
        t0 = time.perf_counter()
        losses = []
        for xb, yb in batches:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = criterion(head(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
        loop_seconds += time.perf_counter() - t0
        wait += batches.wait_seconds
        sel_metrics, _ = score(head, selection, task, device)
        history.append({"epoch": epoch, "train_loss": float(torch.stack(losses).mean()), "selection": sel_metrics})
        if sel_metrics[task.primary_metric] > best["score"]:
            best = {"score": sel_metrics[task.primary_metric], "epoch": epoch,
                    "state": copy.deepcopy(head.state_dict()), "metrics": sel_metrics}
            stale = 0
        else:
            stale += 1
            if stale >= int(settings["patience"]):
                break
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
) -> None:
    """Write ``{out_root}/{head}/seed{seed}/`` (weights, eval predictions, metrics) for every
    head and seed. ``manifest``: the checkpoint's feature manifest."""
    set_threads(threads)
    device = pick_device(settings["device"])
    feats = {split: FeatureSet.open(manifest, split, verify=settings["verify"]) for split in splits_of(task)}
    data = TrainingData(feats["train"], int(settings["batch_size"]), device, float(settings["in_memory_max_mb"]))
    held = {split: fs.read_all() for split, fs in feats.items() if split != "train"}
    moments = data.moments() if settings["standardize"] else None
    source = feats["train"].manifest["source"]
    encoder_params = feats["train"].manifest["encoder_parameters"]
    for head_name, spec in heads.items():
        for seed in seeds:
            t0 = time.perf_counter()
            head, best, history, timing = train_one(task, spec, settings, data, held["selection"], seed, device,
                                                     moments)
            metrics, tables = {}, []
            for split in task.eval_splits:
                metrics[split], outputs = score(head, held[split], task, device)
                _, labels, idx = held[split]
                tables.append(pd.DataFrame({
                    "split": split, "idx": idx, "label": labels,
                    "prediction": predictions_from_outputs(outputs, task.kind), "outputs": list(outputs),
                }))
            out = Path(out_root) / head_name / f"seed{seed}"
            save_head(head, head_name, spec, out)
            atomic_write_parquet(pd.concat(tables, ignore_index=True), out / "eval_predictions.parquet")
            params = count_parameters(head)
            record = {
                "task": task.name, "head": head_name, "head_spec": spec, "seed": seed, "source": source,
                "parameters": params, "encoder_parameters": encoder_params,
                "parameter_percent": 100.0 * params / encoder_params,
                "best_epoch": best["epoch"], "selection_metrics": best["metrics"], "metrics": metrics,
                "history": history, "seconds": time.perf_counter() - t0, **timing,
                "data_in_memory": data.in_memory, "device": str(device),
            }
            core = head.head if isinstance(head, Standardized) else head
            if isinstance(core, ScalarMixHead):
                record["layer_weights"] = core.layer_weights().detach().cpu().tolist()
                record["gamma"] = float(core.gamma.detach())
            atomic_write_json(record, out / "metrics.json")
            log.info("%s %s seed %d: best epoch %d, selection %s, eval %s, data wait %.2f%%", task.name, head_name,
                     seed, best["epoch"], best["metrics"], metrics, 100 * timing["data_wait_share"])
