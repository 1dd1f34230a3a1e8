"""Background producers: items made in a thread and consumed in order, with the time the
consumer waited measured; the padded batches of token-level views; and the shuffled,
bounded-memory batch stream over [CLS] shards."""

from __future__ import annotations

import queue
import threading
import time

import h5py
import numpy as np

from bertvision.errors import FeatureError
from bertvision.features.store import FeatureSet


class Prefetched:
    """Items produced by ``produce()`` (a generator) in a background thread, consumed in
    order; ``wait_seconds`` accumulates the time the consumer spent blocked on the queue."""

    prefetch = 8

    def produce(self):
        raise NotImplementedError

    def _run(self, out: queue.Queue):
        try:
            for item in self.produce():
                out.put(item)
            out.put(None)
        except BaseException as err:  # surface producer errors in the consumer
            out.put(err)

    def __iter__(self):
        self.wait_seconds = getattr(self, "wait_seconds", 0.0)
        out: queue.Queue = queue.Queue(maxsize=self.prefetch)
        thread = threading.Thread(target=self._run, args=(out,), daemon=True)
        thread.start()
        while True:
            t0 = time.perf_counter()
            item = out.get()
            self.wait_seconds += time.perf_counter() - t0
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
        thread.join()


class WindowBatches(Prefetched):
    """One epoch of padded token-level batches (x (B, T, L, H) float32, mask (B, T), labels)
    from any view of windows (``training_batches``: in memory, read from the shards or computed
    by the encoder), assembled by a background thread; ``wait_seconds`` is the trainer's wait."""

    prefetch = 4  # resources.TRAINING_BATCHES_HELD counts these

    def __init__(self, windows, batch_size: int, seed: int, make_batches):
        self.windows, self.batch_size, self.seed, self.make_batches = windows, batch_size, seed, make_batches
        self.wait_seconds = 0.0

    def produce(self):
        yield from self.windows.training_batches(self.batch_size, self.seed, self.make_batches)


class BatchStream(Prefetched):
    """Shuffled mini-batches streamed from a FeatureSet by a background thread.

    Memory stays bounded: shards are visited in random order, each read in blocks of
    ``block_rows`` contiguous rows (large sequential reads), rows shuffled within a buffer of
    ``buffer_rows``. ``wait_seconds`` accumulates the time the consumer spent blocked.
    """

    def __init__(
        self,
        features: FeatureSet,
        batch_size: int,
        seed: int,
        buffer_rows: int = 65536,
        block_rows: int = 4096,
        prefetch: int = 8,
        pin_memory: bool = False,
    ):
        self.features = features
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)
        self.buffer_rows = buffer_rows
        self.block_rows = block_rows
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.wait_seconds = 0.0

    def _blocks(self):
        for shard in self.rng.permutation(len(self.features.shard_paths())):
            path = self.features.shard_paths()[shard]
            try:
                with h5py.File(path, "r") as f:
                    states = f[self.features.reads]
                    n = states.shape[0]
                    starts = self.rng.permutation(np.arange(0, n, self.block_rows))
                    for start in starts:
                        end = min(n, start + self.block_rows)
                        yield states[start:end], f["labels"][start:end]
            except OSError as err:
                raise FeatureError(f"{path}: unreadable HDF5 shard ({err})") from err

    def _batches(self, x: np.ndarray, y: np.ndarray):
        import torch

        for i in range(0, len(x), self.batch_size):
            bx = torch.from_numpy(x[i : i + self.batch_size].astype(np.float32))
            by = torch.from_numpy(y[i : i + self.batch_size])
            yield (bx.pin_memory(), by.pin_memory()) if self.pin_memory else (bx, by)

    def produce(self):
        xs, ys, held = [], [], 0
        for x, y in self._blocks():
            xs.append(x)
            ys.append(y)
            held += len(x)
            if held >= self.buffer_rows:
                x, y = np.concatenate(xs), np.concatenate(ys)
                order = self.rng.permutation(len(x))
                cut = len(x) - len(x) // 2  # keep half the buffer to mix with the next blocks
                yield from self._batches(x[order[:cut]], y[order[:cut]])
                xs, ys, held = [x[order[cut:]]], [y[order[cut:]]], len(x) - cut
        if held:
            x, y = np.concatenate(xs), np.concatenate(ys)
            order = self.rng.permutation(len(x))
            yield from self._batches(x[order], y[order])
