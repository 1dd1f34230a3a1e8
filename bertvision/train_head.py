"""The ``train_head`` stage: train one head architecture on one checkpoint's features for each
configured seed. The number of epochs is chosen on the selection split (early stopping, best
epoch restored); the evaluation splits are only ever scored, never used for a choice."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from bertvision.device import pick_device, set_threads
from bertvision.features import BatchStream, FeatureSet
from bertvision.heads import ScalarMixHead, build_head, count_parameters
from bertvision.io import atomic_path, atomic_write_json, atomic_write_parquet
from bertvision.metrics import compute_metrics, predictions_from_outputs
from bertvision.tasks import TaskSpec, splits_of

log = logging.getLogger(__name__)


def loss_fn(kind: str):
    if kind == "regression":
        return lambda out, y: torch.nn.functional.mse_loss(out[:, 0], y.float())
    return lambda out, y: torch.nn.functional.cross_entropy(out, y.long())


def predict_arrays(head, x: np.ndarray, device, batch_size: int = 1024) -> np.ndarray:
    head.eval()
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            xb = torch.from_numpy(x[i : i + batch_size].astype(np.float32)).to(device)
            outs.append(head(xb).float().cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, 1), dtype=np.float32)


def score(head, data, task: TaskSpec, device) -> tuple[dict, np.ndarray]:
    x, y, _ = data
    outputs = predict_arrays(head, x, device)
    return compute_metrics(task.metrics, predictions_from_outputs(outputs, task.kind), y), outputs


def train_one_seed(task: TaskSpec, spec: dict, settings: dict, train: FeatureSet, selection, seed: int, device):
    torch.manual_seed(seed)
    layers, hidden = train.shape
    head = build_head(spec, layers, hidden, task.num_labels).to(device)
    batch_size = int(settings["batch_size"])
    max_epochs = int(settings["max_epochs"])
    steps_per_epoch = -(-train.n_examples // batch_size)
    total = max_epochs * steps_per_epoch
    warmup = int(round(float(settings["warmup_ratio"]) * total))
    opt = torch.optim.AdamW(head.parameters(), lr=float(settings["learning_rate"]),
                            weight_decay=float(settings["weight_decay"]))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))
    )
    criterion = loss_fn(task.kind)
    primary = task.primary_metric
    best = {"score": -np.inf, "epoch": 0, "state": copy.deepcopy(head.state_dict()), "metrics": None}
    history, wait, loop_seconds, stale = [], 0.0, 0.0, 0
    for epoch in range(1, max_epochs + 1):
        stream = BatchStream(train, batch_size, seed=seed * 1000 + epoch, pin_memory=device.type == "cuda")
        head.train()
        t0 = time.perf_counter()
        losses = []
        for xb, yb in stream:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = criterion(head(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
        loop_seconds += time.perf_counter() - t0
        wait += stream.wait_seconds
        sel_metrics, _ = score(head, selection, task, device)
        history.append({"epoch": epoch, "train_loss": float(torch.stack(losses).mean()), "selection": sel_metrics})
        if sel_metrics[primary] > best["score"]:
            best = {"score": sel_metrics[primary], "epoch": epoch, "state": copy.deepcopy(head.state_dict()),
                    "metrics": sel_metrics}
            stale = 0
        else:
            stale += 1
            if stale >= int(settings["patience"]):
                break
    head.load_state_dict(best["state"])
    timing = {"train_loop_seconds": loop_seconds, "data_wait_seconds": wait,
              "data_wait_share": wait / loop_seconds if loop_seconds else 0.0}
    return head, best, history, timing


def train_head(
    task: TaskSpec,
    head_name: str,
    spec: dict,
    settings: dict,
    manifest: Path,
    seeds: list[int],
    out_dirs: dict[int, Path],
    threads: int | None = None,
) -> None:
    """``manifest``: the checkpoint's feature manifest (train, selection and the eval splits)."""
    set_threads(threads)
    device = pick_device(settings["device"])
    feats = {split: FeatureSet.open(manifest, split, verify=settings["verify"]) for split in splits_of(task)}
    train = feats["train"]
    held = {split: fs.read_all() for split, fs in feats.items() if split != "train"}
    source = train.manifest["source"]
    for seed in seeds:
        t0 = time.perf_counter()
        head, best, history, timing = train_one_seed(task, spec, settings, train, held["selection"], seed, device)
        metrics, tables = {}, []
        for split in task.eval_splits:
            metrics[split], outputs = score(head, held[split], task, device)
            _, labels, idx = held[split]
            tables.append(pd.DataFrame({
                "split": split, "idx": idx, "label": labels,
                "prediction": predictions_from_outputs(outputs, task.kind), "outputs": list(outputs),
            }))
        params = count_parameters(head)
        out = Path(out_dirs[seed])
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / "head.safetensors") as tmp:
            save_file({k: v.contiguous().cpu() for k, v in head.state_dict().items()}, str(tmp),
                      metadata={"head": head_name, "type": spec["type"]})
        atomic_write_parquet(pd.concat(tables, ignore_index=True), out / "eval_predictions.parquet")
        record = {
            "task": task.name,
            "head": head_name,
            "head_spec": spec,
            "seed": seed,
            "source": source,
            "parameters": params,
            "encoder_parameters": train.manifest["encoder_parameters"],
            "parameter_percent": 100.0 * params / train.manifest["encoder_parameters"],
            "best_epoch": best["epoch"],
            "selection_metrics": best["metrics"],
            "metrics": metrics,
            "history": history,
            "seconds": time.perf_counter() - t0,
            **timing,
            "device": str(device),
        }
        if isinstance(head, ScalarMixHead):
            record["layer_weights"] = head.layer_weights().detach().cpu().tolist()
            record["gamma"] = float(head.gamma.detach())
        atomic_write_json(record, out / "metrics.json")
        log.info("%s %s seed %d: best epoch %d, selection %s, eval %s, data wait %.1f%%",
                 task.name, head_name, seed, best["epoch"], best["metrics"], metrics, 100 * timing["data_wait_share"])
