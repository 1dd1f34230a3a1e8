"""Hidden-state features on disk: sharded HDF5 (float16, fletcher32 checksums per chunk) plus a
manifest that readers verify before trusting a byte.

Shard ``i`` of a checkpoint is a directory ``shard-{i}-of-{n}/`` with one file per split; each
file holds rows ``[row_start, row_end)`` of its split:
- ``cls``: (n, layers, hidden) float16, the [CLS] state of every layer (embedding output first);
- ``mean``: (n, layers, hidden) float16, every layer's states averaged over the row's real tokens
  (shards written before it existed lack it: a head that reads it asks for a new extraction);
- ``apart-cls``, ``apart-mean`` (pair tasks some head reads apart): (n, layers, 4 * hidden) float16,
  per row and layer [u, v, |u-v|, u*v] of its two texts' states, each text encoded alone (the
  ``cls`` and ``mean`` rows are absent when no head reads the joint pair);
- ``labels``: (n,) int64 or float32; ``idx``: (n,) int64, the example ids;
- attributes describing where it came from.
Token-level shards (span tasks, and example tasks with ``token_features``) hold every real
token instead (``shard_writer.TokenShardWriter``); example-task token shards keep the ``cls`` and
``mean`` rows too, so the per-example heads read them exactly like a [CLS] shard.
The checkpoint's manifest lists, per split, every shard file with its row range, byte size and sha256.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np

from bertvision.errors import FeatureError
from bertvision.features.source import SOURCE_KEYS
from bertvision.files import atomic_write_json, read_json, sha256_file
from bertvision.layout import shard_file
from bertvision.registry.states import STATES

FORMAT = "bertvision-features/1"


def shard_summary(path: Path, root: Path) -> dict:
    if not Path(path).exists():
        raise FeatureError(f"{path}: missing; its extraction job did not finish")
    with h5py.File(path, "r") as f:
        attrs = {k: _attr_value(v) for k, v in f.attrs.items()}
        reads = [name for name in STATES if name in f]
        first = "states" if "states" in f else reads[0]
        n, layers, width = f[first].shape
    hidden = width // STATES[first].width(1) if first in STATES else width  # 'states': a token shard's, hidden wide
    return {
        "file": str(Path(path).relative_to(root)),
        "rows": [int(attrs["row_start"]), int(attrs["row_end"])],
        "bytes": Path(path).stat().st_size,
        "sha256": sha256_file(path),
        "shape": [int(n), int(layers), int(hidden)],
        "attrs": attrs,
        "reads": reads,
    }


def _attr_value(value):
    """An HDF5 attribute as JSON holds it (a list of strings is read back as an array)."""
    if isinstance(value, np.ndarray):
        return [v.decode() if isinstance(v, bytes) else v for v in value.tolist()]
    return value.item() if hasattr(value, "item") else value


def write_manifest(shard_dirs: list[Path], out: Path, splits: list[str]) -> dict:
    """Check that, for every split, the shards tile it exactly; then record them."""
    root = Path(out).parent
    per_split, source, layers, hidden, reads = {}, None, None, None, set(STATES)
    for split in splits:
        shards = sorted((shard_summary(shard_file(d, split), root) for d in shard_dirs), key=lambda s: s["rows"][0])
        expected = 0
        for s in shards:
            if s["rows"][0] != expected:
                raise FeatureError(f"{out}: {s['file']} starts at row {s['rows'][0]}, expected {expected}")
            expected = s["rows"][1]
            reads &= set(s["reads"])
            if layers is None:
                layers, hidden, source = s["shape"][1], s["shape"][2], s["attrs"]
            if s["shape"][1:] != [layers, hidden]:
                raise FeatureError(f"{out}: {s['file']} has shape {s['shape']}, expected (n, {layers}, {hidden})")
        n_total = int(shards[0]["attrs"]["split_rows"])
        if expected != n_total:
            raise FeatureError(f"{out}: {split} shards cover {expected} rows, the split has {n_total}")
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
        "source": {k: source[k] for k in SOURCE_KEYS if k in source},
        "encoder_parameters": int(source["encoder_parameters"]),
        "label_kind": source["label_kind"],
        # how a pair task's texts reached the encoder: one sequence, each alone, or both
        "pair_forms": list(source.get("pair_forms", ["joint"])),
        # the per-example states every shard holds, each what some heads read (registry.states.STATES)
        "reads": [r for r in STATES if r in reads],
        "encoder_dir": source.get("encoder_dir"),  # the checkpoint extracted (older shards: unknown)
        # where and how the states were computed (older shards: unknown)
        "precision": source.get("precision"),
        "backend": source.get("backend", "torch"),  # what ran the encoder (older shards: torch)
        "device": source.get("device"),
        "splits": per_split,
    }
    atomic_write_json(manifest, out)
    return manifest


@dataclass
class FeatureSet:
    """A verified, read-only view of one split's features."""

    manifest_path: Path
    manifest: dict
    split: str
    reads: str = "cls"  # the per-example states read_all and the batch readers give (registry.states.STATES)

    def reading(self, reads: str) -> FeatureSet:
        """This split's view that reads the per-example states ``reads`` ('cls', 'mean', or a pair's
        apart form, 'apart-cls' or 'apart-mean': ``registry.states.states_name``)."""
        held = self.manifest.get("reads", ["cls"])
        if reads not in held:
            raise FeatureError(
                f"{self.manifest_path}: holds per-example states {held}, not {reads!r} (extracted before "
                f"{reads!r} states were stored: run the extraction again)"
            )
        return replace(self, reads=reads)

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
        """(layers, width) of what this view reads per example (a pair's apart form: PAIR_PARTS wide)."""
        return self.manifest["layers"], STATES[self.reads].width(self.manifest["hidden"])

    @property
    def feature(self) -> str:
        """'cls' ([CLS] rows only) or 'tokens' (every real token; example tasks keep the [CLS] rows too)."""
        return self.manifest["feature"]

    def shard_paths(self) -> list[Path]:
        return [self.manifest_path.parent / s["file"] for s in self.entry["shards"]]

    def read_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(states float16 (N, L, H) as ``reads``, labels, idx) in row order. Every chunk's
        fletcher32 is checked. Token-level features of example tasks give their per-example rows."""
        parts = [read_shard(p, self.reads) for p in self.shard_paths()]
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def labels(self) -> np.ndarray:
        """The labels of the whole split, in row order (no states read)."""
        parts = []
        for path in self.shard_paths():
            with h5py.File(path, "r") as f:
                parts.append(f["labels"][...])
        return np.concatenate(parts)

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


def read_shard(path: Path, reads: str = "cls") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-example states ``reads``, labels, idx) of one shard file."""
    try:
        with h5py.File(path, "r") as f:
            return f[reads][...], f["labels"][...], f["idx"][...]
    except OSError as err:  # fletcher32 mismatch or a damaged file
        raise FeatureError(f"{path}: unreadable HDF5 shard ({err})") from err


class WindowBatching:
    """Padded batches of token-level rows for views that can pad any rows at any time (in
    memory, or computed by the encoder); ``StoredWindows`` reads its own I/O-friendly order."""

    def training_batches(self, batch_size: int, seed: int, make_batches):
        """One epoch of (x, mask, labels): ``make_batches(lengths, batch_size, rng)`` (a task
        kind's shuffled batching) with ``rng`` seeded by ``seed``."""
        for rows in make_batches(self.lengths, batch_size, np.random.default_rng(seed)):
            yield self.padded(rows)

    def inference_batches(self, max_tokens: int, max_rows: int | None = None):
        """(rows, x, mask) of every row once, length-sorted batches of at most ``max_tokens``
        padded tokens and ``max_rows`` rows."""
        from bertvision.data.tokenized import length_batches

        for rows in length_batches(self.lengths, max_tokens, max_rows):
            x, mask, _ = self.padded(rows)
            yield rows, x, mask


@dataclass
class WindowStates(WindowBatching):
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
    def offsets(self) -> list[np.ndarray] | None:
        """Per window, its tokens' (T, 2) character offsets (as TokenizedSplit.offsets; None for
        example tasks)."""
        if self.char_offsets is None:
            return None
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

    def subset(self, rows: np.ndarray) -> WindowStates:
        """The windows ``rows``, in that order, as a new WindowStates (a copy)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, lengths = self.window_offsets[rows], self.lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        take = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        char_offsets = None if self.char_offsets is None else self.char_offsets[take]
        return WindowStates(self.states[take], offsets, char_offsets, self.labels[rows], self.idx[rows])

    def token_chunks(self, batch_size: int | None = None):
        """Every real token's states (float16), as one chunk (``batch_size``: the lazy views')."""
        yield self.states


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
