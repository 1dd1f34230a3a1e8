"""The ``extract`` stage: run a frozen checkpoint over one shard of a split and store the [CLS]
hidden state of every layer (embedding output + each encoder layer).

Rows are processed in contiguous blocks; inside a block, batches are length-sorted so padding
stays small, and the finished block is handed to a writer thread so the forward passes never
wait for the disk.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertvision.backbone import encoder_parameter_count
from bertvision.batching import TokenizedSplit, collate, sorted_batches
from bertvision.device import autocast, pick_device, set_threads, to_device
from bertvision.features import ShardWriter, shard_rows

log = logging.getLogger(__name__)


def load_encoder(checkpoint_dir: Path, device: torch.device):
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = AutoModel.from_pretrained(str(checkpoint_dir), add_pooling_layer=False)
    return model.to(device).eval()


def cls_states(model, batch: dict, device, precision: str) -> torch.Tensor:
    """(B, layers, hidden) [CLS] states of every hidden layer."""
    with autocast(device, precision):
        out = model(**batch, output_hidden_states=True)
    return torch.stack([h[:, 0] for h in out.hidden_states], dim=1)


def plain_forward(model, batch: dict, device, precision: str) -> torch.Tensor:
    """The same forward pass without keeping anything but the last layer (benchmark baseline)."""
    with autocast(device, precision):
        return model(**batch).last_hidden_state[:, 0]


def iter_blocks(split: TokenizedSplit, start: int, end: int, block_rows: int, batch_size: int):
    """Yield (block_start, block_end, batches) with batches as row indices into ``split``."""
    for b0 in range(start, end, block_rows):
        b1 = min(end, b0 + block_rows)
        local = sorted_batches(split.lengths[b0:b1], batch_size)
        yield b0, b1, [rows + b0 for rows in local]


def extract_split(model, split: TokenizedSplit, out_path: Path, shard: int, n_shards: int, settings: dict,
                  attrs: dict, device) -> dict:
    """Rows of shard ``shard`` of one split -> ``out_path``."""
    precision = settings["precision"]
    start, end = shard_rows(len(split), n_shards, shard)
    pad_id = model.config.pad_token_id or 0
    layers, hidden = model.config.num_hidden_layers + 1, model.config.hidden_size
    regression = attrs["label_kind"] == "regression"
    batch_size, block_rows = int(settings["batch_size"]), int(settings["block_rows"])
    shard_attrs = {**attrs, "shard": shard, "n_shards": n_shards, "row_start": start, "row_end": end,
                   "split_rows": len(split), "layers": layers, "hidden": hidden,
                   "encoder_parameters": encoder_parameter_count(model), "precision": precision,
                   "device": str(device)}
    pending: queue.Queue = queue.Queue(maxsize=4)
    errors: list[BaseException] = []
    t0 = time.perf_counter()
    padded = real = 0
    with ShardWriter(out_path, end - start, layers, hidden, "float32" if regression else "int64",
                     shard_attrs) as writer:

        def write_loop():
            try:
                while (item := pending.get()) is not None:
                    writer.write_block(*item)
            except BaseException as err:
                errors.append(err)
                while pending.get() is not None:  # drain so the producer never blocks
                    pass

        thread = threading.Thread(target=write_loop, daemon=True)
        thread.start()
        n_batches = sum(-(-min(block_rows, end - b) // batch_size) for b in range(start, end, block_rows))
        progress = tqdm(total=n_batches, desc=f"extract {attrs['split']} shard {shard}", mininterval=10,
                        unit="batch")
        try:
            with torch.inference_mode():
                for b0, b1, batches in iter_blocks(split, start, end, block_rows, batch_size):
                    block = np.empty((b1 - b0, layers, hidden), dtype=np.float16)
                    for rows in batches:
                        batch = collate(split, rows, pad_id, regression)
                        batch.pop("labels")
                        states = cls_states(model, to_device(batch, device), device, precision)
                        block[rows - b0] = states.to("cpu", torch.float16).numpy()
                        padded += int(split.lengths[rows].max()) * len(rows)
                        real += int(split.lengths[rows].sum())
                        progress.update(1)
                    if errors:
                        raise errors[0]
                    pending.put((b0 - start, block, split.labels[b0:b1], split.idx[b0:b1]))
        finally:
            pending.put(None)
            thread.join()
            progress.close()
        if errors:
            raise errors[0]
    stats = {"rows": end - start, "seconds": time.perf_counter() - t0, "padded_tokens": padded,
             "real_tokens": real}
    log.info("wrote %s: %s", out_path, stats)
    return stats


def extract_shard(
    checkpoint_dir: Path,
    tokens_dir: Path,
    out_dir: Path,
    shard: int,
    n_shards: int,
    splits: list[str],
    settings: dict,
    attrs: dict,
    threads: int | None = None,
) -> dict:
    """Shard ``shard`` of every split -> ``out_dir/{split}.h5``. The files are written into a
    temporary directory renamed to ``out_dir`` at the end, so a killed job leaves no
    ``out_dir`` behind."""
    set_threads(threads)
    device = pick_device(settings["device"])
    model = load_encoder(checkpoint_dir, device)
    out_dir = Path(out_dir)
    tmp_dir = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp_dir.exists():
        shutil.rmtree(tmp_dir)
    tmp_dir.mkdir(parents=True)
    stats = {}
    try:
        for split in splits:
            tokens = TokenizedSplit.read(Path(tokens_dir) / f"{split}.parquet")
            stats[split] = extract_split(model, tokens, tmp_dir / f"{split}.h5", shard, n_shards, settings,
                                         {**attrs, "split": split}, device)
        if out_dir.exists():  # an empty directory left by the scheduler
            out_dir.rmdir()
        os.replace(tmp_dir, out_dir)
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir)
    padded = sum(s["padded_tokens"] for s in stats.values())
    real = sum(s["real_tokens"] for s in stats.values())
    log.info("shard %d/%d done: padding ratio %.3f", shard, n_shards, padded / max(real, 1))
    return stats
