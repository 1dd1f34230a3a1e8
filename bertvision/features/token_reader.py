"""Stored token-level features read lazily, in bounded memory.

``StoredWindows`` answers what ``WindowStates`` does (``lengths``, ``labels``, ``idx``,
``offsets``, ``padded``, ``subset``, ``token_chunks``, ``training_batches``,
``inference_batches``) while it holds only each window's metadata and buffers of states of at
most ``heads.training.in_memory_max_mb`` MiB, the float32 batches made from them included.
Reads are contiguous runs of windows of one shard ("blocks"), never single windows at random:
HDF5 reads and checksums whole chunks of about ``shard_writer.CHUNK_BYTES``.

A training epoch shuffles the blocks (their boundaries shifted at random each epoch), fills a
buffer with them up to the bound and batches the buffer's rows, sorted, with the task kind's
in-memory batching and the in-memory path's random generator (the block order has its own).
A short batch moves on to the next buffer, so an epoch takes as many steps as in memory. When
one buffer holds the whole split, the batches are exactly the in-memory path's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import h5py
import numpy as np

from bertvision.errors import FeatureError
from bertvision.features.shard_writer import CHUNK_BYTES
from bertvision.features.store import FeatureSet, WindowStates
from bertvision.features.streamed import is_streamed, windows_of
from bertvision.plan.estimates import TRAINING_BATCHES_HELD

INFERENCE_BATCHES_HELD = 3  # the padded batch, its standardized copy and the head's activations
BLOCKS_PER_BUFFER = 8
MAX_BLOCK_BYTES = 64 << 20
MIN_BUFFER_BYTES = CHUNK_BYTES  # less than a chunk would read every chunk several times
CHUNK_CACHE_BYTES = 2 * CHUNK_BYTES  # per open shard: runs of windows that share a chunk read it once
OPEN_SHARDS = 4  # shards open at once (each with its chunk cache); blocks visit shards at random


@contextlib.contextmanager
def shard_errors(path: Path):
    try:
        yield
    except OSError as err:  # fletcher32 mismatch or a damaged file
        raise FeatureError(f"{path}: unreadable HDF5 shard ({err})") from err


class StoredSplit:
    """Where each window of a stored split lies (shard, first token, length), with its labels
    and ids, from the shards' small datasets; states are read on demand, character offsets
    on first use."""

    def __init__(self, features: FeatureSet):
        self.paths = features.shard_paths()
        self.shape = features.shape
        shards, offsets, labels, idx = [], [], [], []
        for k, path in enumerate(self.paths):
            with shard_errors(path), h5py.File(path, "r") as f:
                offsets.append(f["window_offsets"][...].astype(np.int64))
                labels.append(f["labels"][...])
                idx.append(f["idx"][...])
                self.has_char_offsets = "char_offsets" in f
            shards.append(np.full(len(offsets[-1]) - 1, k, dtype=np.int64))
        self.shard = np.concatenate(shards)
        self.start = np.concatenate([o[:-1] for o in offsets])
        self.lengths = np.concatenate([np.diff(o) for o in offsets])
        self.labels, self.idx = np.concatenate(labels), np.concatenate(idx)
        self._char_offsets: list[np.ndarray] | None = None

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's states as stored (float16)."""
        return self.shape[0] * self.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum()) * self.token_bytes

    def char_offsets(self) -> list[np.ndarray] | None:
        """Per window, its tokens' (T, 2) character offsets (span tasks; None otherwise)."""
        if self.has_char_offsets and self._char_offsets is None:
            per_window = []
            for path in self.paths:
                with shard_errors(path), h5py.File(path, "r") as f:
                    offsets, windows = f["char_offsets"][...], f["window_offsets"][...]
                per_window.extend(offsets[a:b] for a, b in zip(windows[:-1], windows[1:]))
            self._char_offsets = per_window
        return self._char_offsets

    def read(self, rows: np.ndarray, shards: OpenShards, prefix: WindowStates | None = None) -> WindowStates:
        """The windows ``rows`` (split rows) after those of ``prefix``, as one WindowStates;
        each run of consecutive windows of one shard is one read."""
        lengths = self.lengths[rows]
        before = 0 if prefix is None else len(prefix.states)
        offsets = np.concatenate([[0], before + np.cumsum(lengths)]).astype(np.int64)
        offsets[0] = before
        states = np.empty((int(offsets[-1]), *self.shape), dtype=np.float16)
        if prefix is not None:
            states[:before] = prefix.states
        breaks = np.flatnonzero((np.diff(rows) != 1) | (np.diff(self.shard[rows]) != 0)) + 1
        for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(rows)]):
            if a < b:
                first, last = rows[a], rows[b - 1]
                source = np.s_[self.start[first] : self.start[last] + self.lengths[last]]
                shards.read(self.shard[first], states, source, np.s_[offsets[a] : offsets[b]])
        if prefix is None:
            return WindowStates(states, offsets, None, self.labels[rows], self.idx[rows])
        return WindowStates(
            states,
            np.concatenate([prefix.window_offsets[:-1], offsets]),
            None,
            np.concatenate([prefix.labels, self.labels[rows]]),
            np.concatenate([prefix.idx, self.idx[rows]]),
        )


class OpenShards:
    """A split's shards, opened when read, the last ``OPEN_SHARDS`` used kept open; all closed
    on exit."""

    def __init__(self, paths: list[Path]):
        self.paths, self.files = paths, {}

    def read(self, shard: int, into: np.ndarray, source, dest) -> None:
        path = self.paths[shard]
        with shard_errors(path):
            if shard not in self.files:
                if len(self.files) >= OPEN_SHARDS:
                    self.files.pop(next(iter(self.files))).close()
                self.files[shard] = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
            self.files[shard] = self.files.pop(shard)  # the most recently used last
            self.files[shard]["states"].read_direct(into, source, dest)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self.files.values():
            f.close()
        return False


class StoredWindows:
    """The token-level rows ``rows`` of a stored split, read from the shards when asked for:
    the lazy counterpart of ``WindowStates``, in buffers of at most ``in_memory_max_mb`` MiB."""

    def __init__(self, split: StoredSplit, in_memory_max_mb: float, rows: np.ndarray | None = None):
        self.split, self.in_memory_max_mb = split, in_memory_max_mb
        self.rows = np.arange(len(split.lengths)) if rows is None else np.asarray(rows, dtype=np.int64)
        self.lengths, self.labels, self.idx = split.lengths[self.rows], split.labels[self.rows], split.idx[self.rows]
        self._offsets = None

    @classmethod
    def open(cls, features: FeatureSet, in_memory_max_mb: float) -> StoredWindows:
        return cls(StoredSplit(features), in_memory_max_mb)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def offsets(self) -> list[np.ndarray] | None:
        """Per window, its tokens' (T, 2) character offsets (as TokenizedSplit.offsets)."""
        per_window = self.split.char_offsets()
        if per_window is not None and self._offsets is None:
            self._offsets = [per_window[r] for r in self.rows]
        return self._offsets

    def subset(self, rows: np.ndarray) -> StoredWindows:
        return StoredWindows(self.split, self.in_memory_max_mb, self.rows[rows])

    def _read(self, rows: np.ndarray, shards: OpenShards, prefix: WindowStates | None = None) -> WindowStates:
        """The windows ``rows`` of this view after ``prefix``'s (one read per run of
        consecutive windows: ascending rows of a view whose rows ascend, as subsets' do)."""
        return self.split.read(self.rows[rows], shards, prefix)

    def padded(self, rows: np.ndarray):
        """(x (B, T, L, H) float32, mask (B, T), labels) for rows ``rows`` of this view, read in
        file order (for batches of the view's own order use ``training_batches`` and
        ``inference_batches``)."""
        rows = np.asarray(rows)
        order = np.argsort(self.rows[rows], kind="stable")
        with OpenShards(self.split.paths) as shards:
            buffer = self._read(rows[order], shards)
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        return buffer.padded(position)

    def _blocks(self, block_tokens: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """This view's rows in file order, cut into blocks of about ``block_tokens`` tokens
        (at least one window) within one shard; ``rng`` shifts the cuts."""
        order = np.argsort(self.rows, kind="stable")
        lengths = self.lengths[order]
        first_token = np.cumsum(lengths) - lengths
        shift = 0 if rng is None else int(rng.integers(block_tokens))
        block = (first_token + shift) // block_tokens
        shard = self.split.shard[self.rows[order]]
        return np.split(order, np.flatnonzero((np.diff(block) != 0) | (np.diff(shard) != 0)) + 1)

    def _buffers(self, blocks: list[np.ndarray], buffer_tokens: int) -> list[np.ndarray]:
        """Consecutive blocks grouped into buffers of at most ``buffer_tokens`` tokens (at least
        one block each), each buffer's rows sorted."""
        buffers, current, held = [], [], 0
        for rows in blocks:
            tokens = int(self.lengths[rows].sum())
            if current and held + tokens > buffer_tokens:
                buffers.append(np.sort(np.concatenate(current)))
                current, held = [], 0
            current.append(rows)
            held += tokens
        if current:
            buffers.append(np.sort(np.concatenate(current)))
        return buffers

    def _buffer_tokens(self, batches_held: int, batch_tokens: int) -> int:
        """Tokens a buffer may hold beside ``batches_held`` float32 batches of ``batch_tokens``
        padded tokens: what is left of the bound, but at least one batch and one HDF5 chunk."""
        token_bytes = self.split.token_bytes
        left = self.in_memory_max_mb * 2**20 - batches_held * batch_tokens * 2 * token_bytes
        return max(int(max(left, MIN_BUFFER_BYTES) // token_bytes), batch_tokens)

    def training_batches(self, batch_size: int, seed: int, make_batches):
        """One epoch of (x, mask, labels), the blocks in a random order (``seed``), each buffer's
        rows batched by ``make_batches(lengths, batch_size, rng)`` as ``WindowStates`` does."""
        batch_tokens = batch_size * int(self.lengths.max(initial=1))
        buffer_tokens = self._buffer_tokens(TRAINING_BATCHES_HELD, batch_tokens)
        rng = np.random.default_rng(seed)
        block_rng = np.random.default_rng([seed, 1])
        block_tokens = max(1, min(buffer_tokens // BLOCKS_PER_BUFFER, MAX_BLOCK_BYTES // self.split.token_bytes))
        blocks = self._blocks(block_tokens, block_rng)
        buffers = self._buffers([blocks[i] for i in block_rng.permutation(len(blocks))], buffer_tokens - batch_tokens)
        carried, kept = np.zeros(0, dtype=np.int64), None
        with OpenShards(self.split.paths) as shards:
            for k, rows in enumerate(buffers):
                buffer = self._read(rows, shards, kept)
                rows = np.concatenate([carried, rows])
                batches = make_batches(self.lengths[rows], batch_size, rng)
                short = [b for b in batches if len(b) < batch_size]
                if short and k + 1 < len(buffers):
                    batches = [b for b in batches if len(b) == batch_size]
                    carried_here = np.concatenate(short)
                    carried, kept = rows[carried_here], buffer.subset(carried_here)
                else:
                    carried, kept = np.zeros(0, dtype=np.int64), None
                for batch in batches:
                    yield buffer.padded(batch)
                del buffer  # before the next one is read

    def inference_batches(self, max_tokens: int, max_rows: int | None = None):
        """(rows, x, mask) of every row once: buffers in file order, each cut into length-sorted
        batches of at most ``max_tokens`` padded tokens (fewer where the bound asks) and
        ``max_rows`` rows."""
        from bertvision.data.tokenized import length_batches

        layers, hidden = self.split.shape
        fitting = self.in_memory_max_mb * 2**20 / 2 / (INFERENCE_BATCHES_HELD * layers * hidden * 4)
        max_tokens = max(1, min(max_tokens, int(fitting)))  # the batches' float32 copies: half the bound
        buffer_tokens = self._buffer_tokens(INFERENCE_BATCHES_HELD, max(max_tokens, int(self.lengths.max(initial=1))))
        block_tokens = max(1, min(buffer_tokens // BLOCKS_PER_BUFFER, MAX_BLOCK_BYTES // self.split.token_bytes))
        with OpenShards(self.split.paths) as shards:
            for rows in self._buffers(self._blocks(block_tokens), buffer_tokens):
                buffer = self._read(rows, shards)
                for batch in length_batches(self.lengths[rows], max_tokens, max_rows):
                    x, mask, _ = buffer.padded(batch)
                    yield rows[batch], x, mask
                del buffer

    def token_chunks(self, batch_size: int | None = None):
        """Every real token's states as float16 arrays, a block at a time, in file order
        (``batch_size``: the streamed view's; reads here go by blocks)."""
        buffer_tokens = self._buffer_tokens(0, 0)
        block_tokens = max(1, min(buffer_tokens // BLOCKS_PER_BUFFER, MAX_BLOCK_BYTES // self.split.token_bytes))
        with OpenShards(self.split.paths) as shards:
            for rows in self._blocks(block_tokens):
                yield self._read(rows, shards).states


def token_windows(feats: dict, in_memory_max_mb: float, lazy: bool = False) -> dict:
    """Every split's token-level rows. A stored split is held in memory (``WindowStates``)
    while the float16 bytes of the splits held so far, in ``feats``' order (train first), fit
    in ``in_memory_max_mb`` MiB; the others are ``StoredWindows`` read in buffers of that bound
    (``lazy``: every stored split). Streamed splits: ``windows_of`` (the training split
    recomputed every epoch, the others held when they fit)."""
    left = in_memory_max_mb * 2**20
    views = {}
    for split, features in feats.items():
        if is_streamed(features):
            views[split] = windows_of(features, None if split == "train" else in_memory_max_mb)
            continue
        stored = StoredSplit(features)
        if not lazy and stored.nbytes <= left:
            views[split] = features.read_windows()
            left -= stored.nbytes
        else:
            views[split] = StoredWindows(stored, in_memory_max_mb)
    return views
