"""Writing feature shards (the format is ``features.store``'s): one HDF5 file per split and shard,
written under a temporary name and committed by renaming, float16 with fletcher32 checksums."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import h5py
import numpy as np

from bertvision.errors import FeatureError
from bertvision.features.store import FORMAT
from bertvision.files import disk_full
from bertvision.models.encoder_io import SUMMARY_POSITION

CHUNK_BYTES = 1 << 20
# Shard writers whose file found no room. HDF5 can then neither flush nor close the file, and
# freeing it crashes the process (h5py issue 914): they stay here, open and never freed, and
# the command line ends such a process without finalizing it (errors.DiskFullError).
UNCLOSABLE: list = []


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per HDF5 chunk: about CHUNK_BYTES each, balanced so the chunks tile ``n_rows``
    (HDF5 stores the last chunk whole, so a ragged tail would be padding on disk). An empty
    shard (more shards than rows) gets 1; it is stored unchunked anyway."""
    target = max(1, CHUNK_BYTES // row_bytes)
    n_chunks = max(1, -(-n_rows // target))
    return max(1, -(-n_rows // n_chunks))


def shard_rows(n_rows: int, n_shards: int, shard: int) -> tuple[int, int]:
    """Contiguous row range of shard ``shard`` (0-based) out of ``n_shards``."""
    if not 0 <= shard < n_shards:
        raise ValueError(f"shard {shard} outside 0..{n_shards - 1}")
    return shard * n_rows // n_shards, (shard + 1) * n_rows // n_shards


class ShardWriter:
    """Write one shard to a temporary file; ``commit()`` renames it into place.

    Rows arrive in contiguous blocks (``write_block``). Used as a context manager, an
    exception (or a kill) leaves only the temporary file, which no reader ever opens.
    """

    def __init__(self, path: Path, n_rows: int, layers: int, widths: dict[str, int], label_dtype, attrs: dict):
        """``widths``: each per-example dataset this shard holds (``registry.states.STATES``: 'cls',
        'mean', and a pair's apart forms) and its width per layer."""
        with self._opened(path):
            self.per_example = {name: self._example_states(name, n_rows, layers, w) for name, w in widths.items()}
            self.labels = self._checked("labels", (n_rows,), label_dtype)
            self.idx = self._checked("idx", (n_rows,), "int64")
            self._set_attrs(attrs)
        self.n_rows = n_rows
        self.rows_written = 0

    def _example_states(self, name: str, n_rows: int, layers: int, hidden: int):
        """An (n_rows, layers, hidden) float16 dataset of per-example states ('cls', 'mean', ...)."""
        # fletcher32 needs chunked storage, and HDF5 refuses chunks on an empty dataset.
        rows = chunk_rows(n_rows, layers * hidden * 2)
        chunked = {"chunks": (rows, layers, hidden), "fletcher32": True} if n_rows else {}
        return self.file.create_dataset(name, shape=(n_rows, layers, hidden), dtype="float16", **chunked)

    def _checked(self, name: str, shape: tuple, dtype, data=None):
        """A small dataset (labels, row ids, offsets) with fletcher32 checksums too: verify: size or
        none reads no digest, and a flipped bit in a label or an offset would be read silently."""
        checked = {"chunks": True, "fletcher32": True} if shape[0] else {}
        return self.file.create_dataset(name, shape=shape, dtype=dtype, data=data, **checked)

    @contextlib.contextmanager
    def _opened(self, path: Path):
        """Open the temporary file of ``path``; an error inside the block aborts it."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.file = None
        with self._aborted_on_error():
            self.file = h5py.File(self.tmp, "w")
            yield

    @contextlib.contextmanager
    def _aborted_on_error(self):
        try:
            yield
        except BaseException as err:
            self.abort(err)
            raise

    def _set_attrs(self, attrs: dict) -> None:
        for key, value in attrs.items():
            self.file.attrs[key] = value
        self.file.attrs["format"] = FORMAT

    def write_block(self, start: int, states: dict[str, np.ndarray], labels: np.ndarray, idx: np.ndarray) -> None:
        """Rows ``start .. start + len(labels)``: each per-example dataset's (``states``, every one
        the shard holds), their labels and ids."""
        if set(states) != set(self.per_example):
            raise ValueError(f"{self.path}: states {sorted(states)} given, the shard holds {sorted(self.per_example)}")
        end = start + len(labels)
        for name, values in states.items():
            self.per_example[name][start:end] = values.astype(np.float16, copy=False)
        self.labels[start:end] = labels
        self.idx[start:end] = idx
        self.rows_written += len(labels)

    def commit(self) -> None:
        with self._aborted_on_error():  # closing flushes what HDF5 still holds: the disk may fill up here
            if self.rows_written != self.n_rows:
                raise FeatureError(f"{self.path}: {self.rows_written} of {self.n_rows} rows written")
            self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self, err: BaseException) -> None:
        """Remove the temporary file. After ``err``, a write that found no room, the file is not
        closed (see UNCLOSABLE); only its name goes, and its space comes back when the process ends."""
        if disk_full(err):
            UNCLOSABLE.append(self)
        elif self.file is not None and self.file.id.valid:
            self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort(exc)
        return False


class TokenShardWriter(ShardWriter):
    """A shard of token-level states: only real tokens, no padding.

    - ``states``: (total_tokens, layers, hidden) float16, the windows' tokens back to back;
    - ``window_offsets``: (n + 1,) start of each window in ``states``;
    - ``char_offsets``: (total_tokens, 2) character offsets, -1 outside the context (span
      tasks; ``char_offsets=False`` leaves it out);
    - ``labels``: (n, 2) gold (start, end) token positions for span tasks, or (n,) example
      labels (``label_shape=()``, ``label_dtype``); ``idx``: (n,) question / example rows;
    - ``cls`` (``store_cls=True``, example tasks): (n, layers, hidden), each row's summary token
      (``encoder_io.SUMMARY_POSITION``), and ``mean`` (``store_mean=True``) each row's mean over its
      tokens, so that per-example readers (``read_shard``, ``BatchStream``) need not touch ``states``.
    Rows are windows (or examples); blocks of them arrive in order.
    """

    def __init__(
        self,
        path: Path,
        window_lengths: np.ndarray,
        layers: int,
        hidden: int,
        attrs: dict,
        label_shape: tuple = (2,),
        label_dtype="int64",
        char_offsets: bool = True,
        store_cls: bool = False,
        store_mean: bool = False,
        more_states: dict[str, int] | None = None,
    ):
        """``more_states``: further per-example datasets (a pair's apart forms) and their widths."""
        with self._opened(path):
            n_tokens = int(window_lengths.sum())
            rows = chunk_rows(n_tokens, layers * hidden * 2)
            chunked = {"chunks": (rows, layers, hidden), "fletcher32": True} if n_tokens else {}
            self.states = self.file.create_dataset(
                "states", shape=(n_tokens, layers, hidden), dtype="float16", **chunked
            )
            self.char_offsets = self._checked("char_offsets", (n_tokens, 2), "int32") if char_offsets else None
            n = len(window_lengths)
            self.cls = self._example_states("cls", n, layers, hidden) if store_cls else None
            self.mean = self._example_states("mean", n, layers, hidden) if store_mean else None
            self.more = {name: self._example_states(name, n, layers, w) for name, w in (more_states or {}).items()}
            offsets = np.concatenate([[0], np.cumsum(window_lengths)]).astype(np.int64)
            self._checked("window_offsets", offsets.shape, offsets.dtype, offsets)
            self.window_offsets = offsets
            self.labels = self._checked("labels", (n, *label_shape), label_dtype)
            self.idx = self._checked("idx", (len(window_lengths),), "int64")
            self._set_attrs(attrs)
        self.n_rows = len(window_lengths)
        self.rows_written = 0

    def write_windows(
        self, start: int, states: np.ndarray, char_offsets: np.ndarray | None, labels, idx, mean=None, more=None
    ) -> None:
        """Windows ``start .. start + len(labels)``; ``states``/``char_offsets`` hold their tokens
        (``char_offsets`` None when the shard stores none); ``mean``: their (n, layers, hidden)
        mean states, computed from the encoder's states before rounding (``store_mean``); ``more``:
        their rows of each of ``more_states``."""
        end = start + len(labels)
        t0, t1 = self.window_offsets[start], self.window_offsets[end]
        states = states.astype(np.float16, copy=False)
        self.states[t0:t1] = states
        if self.char_offsets is not None:
            self.char_offsets[t0:t1] = char_offsets
        if self.cls is not None:
            self.cls[start:end] = states[self.window_offsets[start:end] - t0 + SUMMARY_POSITION]
        if (mean is None) != (self.mean is None):
            raise ValueError(f"{self.path}: mean states given {mean is not None}, stored {self.mean is not None}")
        if mean is not None:
            self.mean[start:end] = mean.astype(np.float16, copy=False)
        if set(more or {}) != set(self.more):
            raise ValueError(f"{self.path}: states {sorted(more or {})} given, the shard holds {sorted(self.more)}")
        for name, values in (more or {}).items():
            self.more[name][start:end] = values.astype(np.float16, copy=False)
        self.labels[start:end] = labels
        self.idx[start:end] = idx
        self.rows_written += len(labels)
