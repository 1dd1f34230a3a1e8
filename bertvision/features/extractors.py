"""How one split's shard of a frozen encoder's states is computed and written, per kind of
feature: per example, each layer's [CLS] state and mean over real tokens (``extract_split_cls``),
the same of a pair's two texts encoded apart (``ApartStates``: beside the joint pair's, or alone,
``extract_split_apart``), or every real token's
states (``extract_split_tokens``: span tasks and tasks with ``token_features``).

Rows go in contiguous blocks; inside a block, batches are length-sorted so padding stays small,
spread over the encoder's replicas (one per GPU), and the finished block is handed to a writer
thread so the forward passes never wait for the disk. The ``extract`` stage
(``stages.extract``) chooses the extractor and owns the shard's files."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertvision.config.settings import ExtractSettings
from bertvision.data.tokenized import TokenizedSplit, collate, sorted_batches
from bertvision.features import bert_outputs
from bertvision.features.encode import (
    encoder_pass,
    mean_of,
    pair_features,
    per_example_states,
)
from bertvision.features.shard_writer import ShardWriter, TokenShardWriter, shard_rows
from bertvision.models.encoder_io import bare_encoder_parameter_count, hidden_state_shape, pad_id
from bertvision.registry.states import PAIR_PARTS, READS, states_name
from bertvision.runtime.device import pick_device, to_device

log = logging.getLogger(__name__)


def iter_blocks(
    split: TokenizedSplit, start: int, end: int, block_rows: int, batch_size: int, block_tokens: int | None = None
):
    """Yield (block_start, block_end, batches) with batches as row indices into ``split``.
    A block holds at most ``block_rows`` rows and (if given) about ``block_tokens`` tokens."""
    b0 = start
    while b0 < end:
        b1 = min(end, b0 + block_rows)
        if block_tokens:
            cum = np.cumsum(split.lengths[b0:b1])
            b1 = b0 + max(1, int(np.searchsorted(cum, block_tokens, side="right")))
        local = sorted_batches(split.lengths[b0:b1], batch_size)
        yield b0, b1, [rows + b0 for rows in local]
        b0 = b1


def on_replicas(replicas, batches, run):
    """Call ``run(rows, model, device)`` for every batch of ``batches``, spread over the
    (model, device) ``replicas`` (one thread each; CUDA kernels release the GIL, so several
    GPUs work at once), and yield each batch's rows once it is done."""
    if len(replicas) == 1:
        for rows in batches:
            run(rows, *replicas[0])
            yield rows
        return

    def run_without_grad(rows, model, device):  # inference mode is per thread
        with torch.inference_mode():
            run(rows, model, device)

    with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
        futures = [pool.submit(run_without_grad, rows, *replicas[i % len(replicas)]) for i, rows in enumerate(batches)]
        for rows, future in zip(batches, futures):
            future.result()
            yield rows


def extraction_devices(preference: str) -> list[torch.device]:
    """Every GPU this job may use (a job given several GPUs spreads its batches over them),
    else the one device ``pick_device`` chooses."""
    device = pick_device(preference)
    if (
        device.type == "cuda"
        and "LOCAL_RANK" not in os.environ
        and torch.cuda.device_count() > 1
        and "CUDA_VISIBLE_DEVICES" in os.environ
    ):
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


class BackgroundWriter:
    """Runs ``write(*item)`` for queued items in a thread, so compute never waits for the disk."""

    def __init__(self, write):
        self.pending: queue.Queue = queue.Queue(maxsize=4)
        self.errors: list[BaseException] = []
        self.write = write
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        try:
            while (item := self.pending.get()) is not None:
                self.write(*item)
        except BaseException as err:
            self.errors.append(err)
            while self.pending.get() is not None:  # drain so the producer never blocks
                pass

    def put(self, item) -> None:
        if self.errors:
            raise self.errors[0]
        self.pending.put(item)

    def close(self) -> None:
        self.pending.put(None)
        self.thread.join()
        if self.errors:
            raise self.errors[0]


def _shard_attrs(model, split, attrs, shard, n_shards, start, end, precision, device) -> dict:
    layers, hidden = hidden_state_shape(model)
    return {
        **attrs,
        "shard": shard,
        "n_shards": n_shards,
        "row_start": start,
        "row_end": end,
        "split_rows": len(split),
        "layers": layers,
        "hidden": hidden,
        "encoder_parameters": bare_encoder_parameter_count(model),
        "precision": precision,
        "device": str(device),
    }


def _written(out_path: Path, rows: int, t0: float, padded: int, real: int, **counts) -> dict:
    """A written shard's record: its rows (and ``counts``: texts, tokens), seconds since ``t0``
    and tokens, padded and real."""
    stats = {"rows": rows, **counts, "seconds": time.perf_counter() - t0, "padded_tokens": padded, "real_tokens": real}
    log.info("wrote %s: %s", out_path, stats)
    return stats


def example_label_dtype(attrs: dict) -> str:
    return "float32" if attrs["label_kind"] == "regression" else "int64"


class ApartStates:
    """One shard's pairs encoded apart: each distinct text its rows name (``texts``) encoded alone,
    once, its per-example states rounded as stored; then per row and layer ``pair_features`` of
    its two texts' states, for each of ``READS`` (``block``). Runs on the first replica's device."""

    def __init__(self, replicas, split: TokenizedSplit, texts: TokenizedSplit, start, end, settings, precision, desc):
        model, device = replicas[0]
        self.sides = split.sides[start:end]
        needed = np.unique(self.sides)
        self.position = np.full(len(texts), -1, dtype=np.int64)
        self.position[needed] = np.arange(len(needed))
        layers, hidden = hidden_state_shape(model)
        self.width = len(PAIR_PARTS) * hidden
        padding = pad_id(model)
        self.states = {reads: np.empty((len(needed), layers, hidden), dtype=np.float16) for reads in READS}
        self.texts, self.padded, self.real = len(needed), 0, 0
        with torch.inference_mode():
            batches = sorted_batches(texts.lengths[needed], settings.batch_size)
            for rows in tqdm(batches, desc=f"encode {desc} texts", mininterval=10, unit="batch"):
                batch = to_device(collate(texts, needed[rows], padding), device)
                layer_states, _ = encoder_pass(model, batch, device, precision)
                for reads, pooled in per_example_states(layer_states, batch["attention_mask"]).items():
                    self.states[reads][rows] = pooled.to("cpu", torch.float16).numpy()
                lengths = texts.lengths[needed[rows]]
                self.padded += int(lengths.max()) * len(rows)
                self.real += int(lengths.sum())

    @property
    def widths(self) -> dict[str, int]:
        return {states_name(reads, "apart"): self.width for reads in READS}

    def block(self, b0: int, b1: int) -> dict[str, np.ndarray]:
        """The apart states of the shard's rows ``b0 .. b1`` (counted from the shard's start)."""
        a, b = self.position[self.sides[b0:b1, 0]], self.position[self.sides[b0:b1, 1]]
        return {
            states_name(reads, "apart"): pair_features(torch.from_numpy(x[a]), torch.from_numpy(x[b]))
            .to(torch.float16)
            .numpy()
            for reads, x in self.states.items()
        }


def extract_split_cls(
    replicas,
    split: TokenizedSplit,
    out_path: Path,
    shard: int,
    n_shards: int,
    settings: ExtractSettings,
    precision: str,
    attrs: dict,
    head_outputs: bert_outputs.HeadOutputs | None = None,
    apart: ApartStates | None = None,
) -> dict:
    """Rows of shard ``shard`` of one split -> ``out_path``: [CLS] states of every layer, and their
    mean over real tokens. ``replicas``: (model, device) pairs; batches are spread over them.
    ``head_outputs``: keep the task model's head outputs there too; ``apart``: the same pairs
    encoded apart, stored beside them."""
    model, device = replicas[0]
    start, end = shard_rows(len(split), n_shards, shard)
    padding = pad_id(model)
    layers, hidden = hidden_state_shape(model)
    label_dtype = example_label_dtype(attrs)
    batch_size, block_rows = settings.batch_size, settings.block_rows
    t0 = time.perf_counter()
    padded = real = 0
    shard_attrs = _shard_attrs(model, split, attrs, shard, n_shards, start, end, precision, device)
    widths = {**dict.fromkeys(READS, hidden), **(apart.widths if apart else {})}
    with ShardWriter(out_path, end - start, layers, widths, label_dtype, shard_attrs) as writer:
        background = BackgroundWriter(writer.write_block)
        n_batches = sum(-(-min(block_rows, end - b) // batch_size) for b in range(start, end, block_rows))
        progress = tqdm(total=n_batches, desc=f"extract {attrs['split']} shard {shard}", mininterval=10, unit="batch")
        try:
            with torch.inference_mode():
                for b0, b1, batches in iter_blocks(split, start, end, block_rows, batch_size):
                    block = {reads: np.empty((b1 - b0, layers, hidden), dtype=np.float16) for reads in READS}

                    def run(rows, model, device, block=block, b0=b0):
                        batch = to_device(collate(split, rows, padding), device)
                        layer_states, head = encoder_pass(model, batch, device, precision)
                        for reads, states in per_example_states(layer_states, batch["attention_mask"]).items():
                            block[reads][rows - b0] = states.to("cpu", torch.float16).numpy()
                        if head_outputs is not None:
                            head_outputs.keep(rows, head)

                    for rows in on_replicas(replicas, batches, run):
                        padded += int(split.lengths[rows].max()) * len(rows)
                        real += int(split.lengths[rows].sum())
                        progress.update(1)
                    if apart:
                        block.update(apart.block(b0 - start, b1 - start))
                    background.put((b0 - start, block, split.labels[b0:b1], split.idx[b0:b1]))
        finally:
            progress.close()  # first: a writer's error ends the log on a line of its own
            background.close()
    if apart:
        return _written(out_path, end - start, t0, padded + apart.padded, real + apart.real, texts=apart.texts)
    return _written(out_path, end - start, t0, padded, real)


def extract_split_apart(
    replicas,
    split: TokenizedSplit,
    texts: TokenizedSplit,
    out_path: Path,
    shard: int,
    n_shards: int,
    settings: ExtractSettings,
    precision: str,
    attrs: dict,
) -> dict:
    """Rows of shard ``shard`` of a pair task whose heads all read it encoded apart -> ``out_path``:
    ``ApartStates`` alone (no pass over the joint pairs)."""
    model, device = replicas[0]
    start, end = shard_rows(len(split), n_shards, shard)
    t0 = time.perf_counter()
    apart = ApartStates(replicas, split, texts, start, end, settings, precision, attrs["split"])
    layers, _ = hidden_state_shape(model)
    shard_attrs = _shard_attrs(model, split, attrs, shard, n_shards, start, end, precision, device)
    with ShardWriter(out_path, end - start, layers, apart.widths, example_label_dtype(attrs), shard_attrs) as writer:
        for b0 in range(0, end - start, settings.block_rows):
            b1 = min(end - start, b0 + settings.block_rows)
            rows = slice(start + b0, start + b1)
            writer.write_block(b0, apart.block(b0, b1), split.labels[rows], split.idx[rows])
    return _written(out_path, end - start, t0, apart.padded, apart.real, texts=apart.texts)


def extract_split_tokens(
    replicas,
    split: TokenizedSplit,
    out_path: Path,
    shard: int,
    n_shards: int,
    settings: ExtractSettings,
    precision: str,
    attrs: dict,
    head_outputs: bert_outputs.HeadOutputs | None = None,
    apart: ApartStates | None = None,
) -> dict:
    """Windows of shard ``shard`` of one split -> ``out_path``: the states of every real token
    of every layer, ragged; span tasks with the windows' character offsets, example tasks
    (``token_features``) with each example's label and its [CLS] rows kept apart as well.
    ``head_outputs``: keep the task model's head outputs there too; ``apart``: a pair task's
    texts encoded apart, stored per example beside them."""
    model, device = replicas[0]
    start, end = shard_rows(len(split), n_shards, shard)
    padding = pad_id(model)
    layers, hidden = hidden_state_shape(model)
    batch_size, block_rows, block_tokens = settings.batch_size, settings.block_rows, settings.block_tokens
    lengths = split.lengths[start:end]
    t0 = time.perf_counter()
    padded = real = 0
    shard_attrs = _shard_attrs(model, split, attrs, shard, n_shards, start, end, precision, device)
    span = attrs["label_kind"] == "span"
    labels = (
        {}
        if span
        else {
            "label_shape": (),
            "char_offsets": False,
            "store_cls": True,
            "store_mean": True,
            "label_dtype": example_label_dtype(attrs),
            "more_states": apart.widths if apart else None,
        }
    )
    with TokenShardWriter(out_path, lengths, layers, hidden, shard_attrs, **labels) as writer:
        background = BackgroundWriter(writer.write_windows)
        progress = tqdm(
            total=end - start, desc=f"extract {attrs['split']} shard {shard}", mininterval=10, unit="window"
        )
        try:
            with torch.inference_mode():
                for b0, b1, batches in iter_blocks(split, start, end, block_rows, batch_size, block_tokens):
                    local = np.concatenate([[0], np.cumsum(split.lengths[b0:b1])])
                    block = np.empty((int(local[-1]), layers, hidden), dtype=np.float16)
                    means = None if span else np.empty((b1 - b0, layers, hidden), dtype=np.float16)

                    def run(rows, model, device, block=block, local=local, b0=b0, means=means):
                        batch = to_device(collate(split, rows, padding), device)
                        layer_states, head = encoder_pass(model, batch, device, precision)
                        states = torch.stack(layer_states, dim=2).to("cpu", torch.float16).numpy()
                        if means is not None:
                            mean = mean_of(layer_states, batch["attention_mask"])
                            means[rows - b0] = mean.to("cpu", torch.float16).numpy()
                        if head_outputs is not None:
                            head_outputs.keep(rows, head)
                        for j, i in enumerate(rows):
                            block[local[i - b0] : local[i - b0 + 1]] = states[j, : split.lengths[i]]

                    for rows in on_replicas(replicas, batches, run):
                        padded += int(split.lengths[rows].max()) * len(rows)
                        real += int(split.lengths[rows].sum())
                        progress.update(len(rows))
                    char_offsets = np.concatenate([split.offsets[i] for i in range(b0, b1)]) if span else None
                    more = apart.block(b0 - start, b1 - start) if apart else None
                    rows_of = (split.labels[b0:b1], split.idx[b0:b1])
                    background.put((b0 - start, block, char_offsets, *rows_of, means, more))
        finally:
            progress.close()  # first: a writer's error ends the log on a line of its own
            background.close()
    if apart:
        padded, real = padded + apart.padded, real + apart.real
        return _written(out_path, end - start, t0, padded, real, tokens=int(lengths.sum()), texts=apart.texts)
    return _written(out_path, end - start, t0, padded, real, tokens=int(lengths.sum()))


# Task kind -> what is stored per example.
EXTRACTORS = {"classification": extract_split_cls, "regression": extract_split_cls, "span": extract_split_tokens}


def feature_level(attrs: dict) -> str:
    """'tokens' (every real token: span tasks, or ``attrs["features"] == "tokens"``, set for
    example tasks with ``token_features``) or 'cls'."""
    level = attrs.get("features") or ("tokens" if attrs["label_kind"] == "span" else "cls")
    if level not in ("cls", "tokens") or (attrs["label_kind"] == "span" and level != "tokens"):
        raise ValueError(f"features {level!r} for a {attrs['label_kind']} task")
    return level


def extractor(attrs: dict):
    return extract_split_tokens if feature_level(attrs) == "tokens" else EXTRACTORS[attrs["label_kind"]]
