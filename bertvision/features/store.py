"""Hidden-state features on disk: sharded HDF5 (float16, fletcher32 checksums per chunk) plus a
manifest that readers verify before trusting a byte.

Shard ``i`` of a checkpoint is a directory ``shard-{i}-of-{n}/`` with one file per split; each
file holds rows ``[row_start, row_end)`` of its split:
- ``cls``: (n, layers, hidden) float16, the [CLS] state of every layer (embedding output first);
- ``labels``: (n,) int64 or float32; ``idx``: (n,) int64, the example ids;
- attributes describing where it came from.
Token-level shards (span tasks, and example tasks with ``token_features``) hold every real
token instead (``TokenShardWriter``); example-task token shards keep the ``cls`` rows too, so
the [CLS] heads read them exactly like a [CLS] shard.
The checkpoint's manifest lists, per split, every shard file with its row range, byte size and sha256.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bertvision.errors import FeatureError
from bertvision.layout import shard_file
from bertvision.models.encoder_io import SUMMARY_POSITION
from bertvision.runtime.io import atomic_write_json, disk_full, read_json, sha256_file

FORMAT = "bertvision-features/1"
CHUNK_BYTES = 1 << 20
# Shard writers whose file found no room. HDF5 can then neither flush nor close the file, and
# freeing it crashes the process (h5py issue 914): they stay here, open and never freed, and
# the command line ends such a process without finalizing it (errors.DiskFullError).
UNCLOSABLE: list = []


def chunk_rows(n_rows: int, row_bytes: int) -> int:
    """Rows per HDF5 chunk: about CHUNK_BYTES each, balanced so the chunks tile ``n_rows``
    (HDF5 stores the last chunk whole, so a ragged tail would be padding on disk)."""
    target = max(1, CHUNK_BYTES // row_bytes)
    n_chunks = -(-n_rows // target)
    return -(-n_rows // n_chunks)


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

    def __init__(self, path: Path, n_rows: int, layers: int, hidden: int, label_dtype, attrs: dict):
        with self._opened(path):
            # fletcher32 needs chunked storage, and HDF5 refuses chunks on an empty dataset.
            rows = chunk_rows(n_rows, layers * hidden * 2)
            chunked = {"chunks": (rows, layers, hidden), "fletcher32": True} if n_rows else {}
            self.cls = self.file.create_dataset("cls", shape=(n_rows, layers, hidden), dtype="float16", **chunked)
            self.labels = self.file.create_dataset("labels", shape=(n_rows,), dtype=label_dtype)
            self.idx = self.file.create_dataset("idx", shape=(n_rows,), dtype="int64")
            self._set_attrs(attrs)
        self.n_rows = n_rows
        self.rows_written = 0

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

    def write_block(self, start: int, cls: np.ndarray, labels: np.ndarray, idx: np.ndarray) -> None:
        end = start + len(cls)
        self.cls[start:end] = cls.astype(np.float16, copy=False)
        self.labels[start:end] = labels
        self.idx[start:end] = idx
        self.rows_written += len(cls)

    def commit(self) -> None:
        with self._aborted_on_error():  # closing flushes what HDF5 still holds: the disk may fill up here
            if self.rows_written != self.n_rows:
                raise FeatureError(f"{self.path}: {self.rows_written} of {self.n_rows} rows written")
            self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self, err: BaseException | None = None) -> None:
        """Remove the temporary file. After ``err``, a write that found no room, the file is not
        closed (see UNCLOSABLE); only its name goes, and its space comes back when the process ends."""
        if err is not None and disk_full(err):
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
      (``encoder_io.SUMMARY_POSITION``), so that [CLS] readers (``read_shard``, ``BatchStream``) need
    not touch ``states``.
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
    ):
        with self._opened(path):
            n_tokens = int(window_lengths.sum())
            rows = chunk_rows(n_tokens, layers * hidden * 2)
            chunked = {"chunks": (rows, layers, hidden), "fletcher32": True} if n_tokens else {}
            self.states = self.file.create_dataset(
                "states", shape=(n_tokens, layers, hidden), dtype="float16", **chunked
            )
            self.char_offsets = (
                self.file.create_dataset("char_offsets", shape=(n_tokens, 2), dtype="int32") if char_offsets else None
            )
            self.cls = None
            n = len(window_lengths)
            if store_cls:
                rows = chunk_rows(n, layers * hidden * 2)
                self.cls = self.file.create_dataset(
                    "cls",
                    shape=(n, layers, hidden),
                    dtype="float16",
                    **({"chunks": (rows, layers, hidden), "fletcher32": True} if n else {}),
                )
            offsets = np.concatenate([[0], np.cumsum(window_lengths)]).astype(np.int64)
            self.file.create_dataset("window_offsets", data=offsets)
            self.window_offsets = offsets
            self.labels = self.file.create_dataset("labels", shape=(n, *label_shape), dtype=label_dtype)
            self.idx = self.file.create_dataset("idx", shape=(len(window_lengths),), dtype="int64")
            self._set_attrs(attrs)
        self.n_rows = len(window_lengths)
        self.rows_written = 0

    def write_windows(self, start: int, states: np.ndarray, char_offsets: np.ndarray | None, labels, idx) -> None:
        """Windows ``start .. start + len(labels)``; ``states``/``char_offsets`` hold their tokens
        (``char_offsets`` None when the shard stores none)."""
        end = start + len(labels)
        t0, t1 = self.window_offsets[start], self.window_offsets[end]
        states = states.astype(np.float16, copy=False)
        self.states[t0:t1] = states
        if self.char_offsets is not None:
            self.char_offsets[t0:t1] = char_offsets
        if self.cls is not None:
            self.cls[start:end] = states[self.window_offsets[start:end] - t0 + SUMMARY_POSITION]
        self.labels[start:end] = labels
        self.idx[start:end] = idx
        self.rows_written += len(labels)


def shard_summary(path: Path, root: Path) -> dict:
    if not Path(path).exists():
        raise FeatureError(f"{path}: missing; its extraction job did not finish")
    with h5py.File(path, "r") as f:
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        shape = f["states" if "states" in f else "cls"].shape
    return {
        "file": str(Path(path).relative_to(root)),
        "rows": [int(attrs["row_start"]), int(attrs["row_end"])],
        "bytes": Path(path).stat().st_size,
        "sha256": sha256_file(path),
        "shape": list(shape),
        "attrs": attrs,
    }


def write_manifest(shard_dirs: list[Path], manifest_path: Path, splits: list[str]) -> dict:
    """Check that, for every split, the shards tile it exactly; then record them."""
    root = Path(manifest_path).parent
    per_split, source, layers, hidden = {}, None, None, None
    for split in splits:
        shards = sorted((shard_summary(shard_file(d, split), root) for d in shard_dirs), key=lambda s: s["rows"][0])
        expected = 0
        for s in shards:
            if s["rows"][0] != expected:
                raise FeatureError(f"{manifest_path}: {s['file']} starts at row {s['rows'][0]}, expected {expected}")
            expected = s["rows"][1]
            if layers is None:
                layers, hidden, source = s["shape"][1], s["shape"][2], s["attrs"]
            if s["shape"][1:] != [layers, hidden]:
                raise FeatureError(
                    f"{manifest_path}: {s['file']} has shape {s['shape']}, expected (n, {layers}, {hidden})"
                )
        n_total = int(shards[0]["attrs"]["split_rows"])
        if expected != n_total:
            raise FeatureError(f"{manifest_path}: {split} shards cover {expected} rows, the split has {n_total}")
        per_split[split] = {
            "n_examples": n_total,
            "shards": [{k: s[k] for k in ("file", "rows", "bytes", "sha256")} for s in shards],
        }
    manifest = {
        "format": FORMAT,
        "feature": source.get("features") or ("tokens" if source["label_kind"] == "span" else "cls"),
        "dtype": "float16",
        "layers": layers,
        "hidden": hidden,
        "source": {k: source[k] for k in ("model", "task", "checkpoint", "ft_seed", "encoder") if k in source},
        "encoder_parameters": int(source["encoder_parameters"]),
        "label_kind": source["label_kind"],
        # where and how the states were computed (older shards: unknown)
        "precision": source.get("precision"),
        "device": source.get("device"),
        "splits": per_split,
    }
    atomic_write_json(manifest, manifest_path)
    return manifest


@dataclass
class FeatureSet:
    """A verified, read-only view of one split's features."""

    manifest_path: Path
    manifest: dict
    split: str

    @classmethod
    def open(cls, manifest_path: Path, split: str, verify: str = "sha256") -> FeatureSet:
        """``verify``: 'sha256' (full checksum), 'size' (cheap), or 'none'."""
        manifest_path = Path(manifest_path)
        if not manifest_path.exists():
            raise FeatureError(f"{manifest_path}: no manifest; the extraction did not finish")
        manifest = read_json(manifest_path)
        if manifest.get("format") != FORMAT:
            raise FeatureError(f"{manifest_path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
        if split not in manifest["splits"]:
            raise FeatureError(f"{manifest_path}: no split {split!r}; has {sorted(manifest['splits'])}")
        for shard in manifest["splits"][split]["shards"]:
            path = manifest_path.parent / shard["file"]
            if not path.exists():
                raise FeatureError(f"{path}: listed in {manifest_path} but missing")
            if verify in ("size", "sha256") and path.stat().st_size != shard["bytes"]:
                raise FeatureError(
                    f"{path}: {path.stat().st_size} bytes, the manifest says {shard['bytes']} (truncated or replaced)"
                )
            if verify == "sha256" and sha256_file(path) != shard["sha256"]:
                raise FeatureError(f"{path}: sha256 differs from {manifest_path} (the file was modified)")
        return cls(manifest_path, manifest, split)

    @property
    def entry(self) -> dict:
        return self.manifest["splits"][self.split]

    @property
    def n_examples(self) -> int:
        return self.entry["n_examples"]

    @property
    def shape(self) -> tuple[int, int]:
        return self.manifest["layers"], self.manifest["hidden"]

    @property
    def feature(self) -> str:
        """'cls' ([CLS] rows only) or 'tokens' (every real token; example tasks keep the [CLS] rows too)."""
        return self.manifest["feature"]

    def shard_paths(self) -> list[Path]:
        return [self.manifest_path.parent / s["file"] for s in self.entry["shards"]]

    def read_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cls float16 (N, L, H), labels, idx) in row order. Every chunk's fletcher32 is checked.
        Token-level features of example tasks give their [CLS] rows (first token of each row)."""
        parts = [read_shard(p) for p in self.shard_paths()]
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def read_windows(self) -> WindowStates:
        """Token-level features of the whole split (span windows, or examples of a task with
        ``token_features``), in row order."""
        if self.feature != "tokens":
            raise FeatureError(
                f"{self.manifest_path}: holds [CLS] features only, not every token "
                f"(set tasks.{self.manifest['source']['task']}.token_features: true)"
            )
        return concat_windows([read_token_shard(p) for p in self.shard_paths()])

    def bytes_on_disk(self) -> int:
        return sum(s["bytes"] for s in self.entry["shards"])


def read_shard(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        with h5py.File(path, "r") as f:
            return f["cls"][...], f["labels"][...], f["idx"][...]
    except OSError as err:  # fletcher32 mismatch or a damaged file
        raise FeatureError(f"{path}: unreadable HDF5 shard ({err})") from err


@dataclass
class WindowStates:
    """Token-level features of a split: every window's real tokens, back to back."""

    states: np.ndarray  # (total_tokens, layers, hidden) float16
    window_offsets: np.ndarray  # (n_windows + 1,)
    char_offsets: np.ndarray | None  # (total_tokens, 2); None for example tasks
    labels: np.ndarray  # (n_windows, 2); (n,) for example tasks
    idx: np.ndarray  # (n_windows,) question rows

    def __len__(self) -> int:
        return len(self.labels)

    def window(self, i: int) -> slice:
        return slice(int(self.window_offsets[i]), int(self.window_offsets[i + 1]))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.window_offsets)

    @property
    def offsets(self) -> list[np.ndarray]:
        """Per window, its tokens' (T, 2) character offsets (as TokenizedSplit.offsets)."""
        return [self.char_offsets[self.window(i)] for i in range(len(self))]

    def padded(self, rows: np.ndarray):
        """(x (B, T, L, H) float32, mask (B, T), labels) for the windows ``rows``."""
        import torch

        lengths = self.lengths[rows]
        x = np.zeros((len(rows), int(lengths.max()), *self.states.shape[1:]), dtype=np.float32)
        mask = np.zeros(x.shape[:2], dtype=bool)
        for j, i in enumerate(rows):
            x[j, : lengths[j]] = self.states[self.window(i)]
            mask[j, : lengths[j]] = True
        return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(self.labels[rows])


def read_token_shard(path: Path) -> WindowStates:
    try:
        with h5py.File(path, "r") as f:
            char_offsets = f["char_offsets"][...] if "char_offsets" in f else None
            return WindowStates(
                f["states"][...], f["window_offsets"][...], char_offsets, f["labels"][...], f["idx"][...]
            )
    except OSError as err:
        raise FeatureError(f"{path}: unreadable HDF5 shard ({err})") from err


def concat_windows(parts: list[WindowStates]) -> WindowStates:
    offsets, base = [np.zeros(1, np.int64)], 0
    for p in parts:
        offsets.append(p.window_offsets[1:] + base)
        base += int(p.window_offsets[-1])
    char_offsets = (
        None if any(p.char_offsets is None for p in parts) else np.concatenate([p.char_offsets for p in parts])
    )
    return WindowStates(
        np.concatenate([p.states for p in parts]),
        np.concatenate(offsets),
        char_offsets,
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.idx for p in parts]),
    )
