"""Streamed features (``store: false``): the frozen checkpoint runs inside head training, so
no feature file is ever written. A ``StreamSource`` names the checkpoint, the task's tokenized
splits and the extraction settings; ``open_split`` gives a stored ``FeatureSet`` or a
``StreamedSplit`` that answers the same reads (``read_all``, ``read_windows``, ``shape``) by
running the encoder, plus ``StreamedWindows``, a lazy view whose padded batches are computed on
demand. States go through the extraction's precision and are rounded to float16, as the
stored ones are, so both paths feed the heads the same values."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch

from bertvision.data.tokenized import TokenizedSplit, collate, sorted_batches
from bertvision.features.encode import as_stored, example_states, frozen_encoder, token_states
from bertvision.features.source import SOURCE_KEYS, StreamSource
from bertvision.features.store import FeatureSet, WindowBatching, WindowStates
from bertvision.layout import split_file
from bertvision.models.backbone import encoder_parameter_count
from bertvision.models.encoder_io import hidden_state_shape, pad_id
from bertvision.registry.states import READS
from bertvision.runtime.backend import backend_of, backend_precision
from bertvision.runtime.device import pick_device, to_device


class StreamedEncoder:
    """The frozen encoder of one source on its device, with the seconds and sequences it has
    spent (``seconds`` counts only forward passes, synchronized on a GPU)."""

    def __init__(self, source: StreamSource):
        self.source = source
        compute = source.compute
        # ONNX Runtime: the CPU; auto runs PyTorch on a GPU
        self.device = pick_device(compute.device if compute.backend in ("torch", "auto") else "cpu")
        self.model = frozen_encoder(Path(source.checkpoint), self.device, compute.backend, compute.precision)
        self.backend = backend_of(self.model)
        self.precision = backend_precision(self.device, compute.precision, self.model, self.backend)
        self.pad_id = pad_id(self.model)
        self.shape = hidden_state_shape(self.model)
        self.parameters = encoder_parameter_count(self.model)
        self.seconds, self.sequences, self.tokens = 0.0, 0, 0

    def encode(self, split: TokenizedSplit, rows: np.ndarray, level: str):
        """Per-example states (B, L, H) for ``level`` 'cls' or 'mean' (``registry.states.READS``),
        or (every token's states (B, T, L, H), mask (B, T)) for 'tokens'; float32 on the device,
        rounded as stored."""
        t0 = time.perf_counter()
        batch = to_device(collate(split, rows, self.pad_id), self.device)
        with torch.no_grad():  # not inference mode: the heads keep these for their backward pass
            if level in READS:
                out = as_stored(example_states(self.model, batch, self.device, self.precision, level))
            else:
                out = (
                    as_stored(token_states(self.model, batch, self.device, self.precision)),
                    batch["attention_mask"].bool(),
                )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0
        self.sequences += len(rows)
        self.tokens += int(split.lengths[rows].sum())
        return out

    def spent(self) -> dict:
        """What this encoder has done so far in the process (callers take differences)."""
        return {"encoder_seconds": self.seconds, "encoder_sequences": self.sequences, "encoder_tokens": self.tokens}


_ENCODERS: dict[str, StreamedEncoder] = {}


def streamed_encoder(source: StreamSource) -> StreamedEncoder:
    """One encoder per source and process, shared by every split and problem."""
    key = source.to_json()
    if key not in _ENCODERS:
        _ENCODERS[key] = StreamedEncoder(source)
    return _ENCODERS[key]


class StreamedSplit:
    """One split of a streamed source, read like a ``FeatureSet``: nothing is stored; reads run
    the encoder (``read_all``/``read_windows`` once over the whole split, ``windows`` lazily)."""

    reads = "cls"  # the per-example states read_all and the batches give (FeatureSet.reads)

    def __init__(self, source: StreamSource, split: str):
        self.source, self.split = source, split
        self.encoder = streamed_encoder(source)
        self.tokens = TokenizedSplit.read(split_file(Path(source.tokens_dir), split))
        self.manifest_path = Path(source.checkpoint)  # named in messages, as a manifest would be
        self.manifest = {
            "source": {k: source.attrs[k] for k in SOURCE_KEYS if k in source.attrs},
            "encoder_parameters": self.encoder.parameters,
            "feature": source.level,
            "stream": True,
            "encoder_dir": source.checkpoint,
            "precision": self.encoder.precision,
            "backend": self.encoder.backend,
            "device": str(self.encoder.device),
        }

    @property
    def n_examples(self) -> int:
        return len(self.tokens)

    @property
    def shape(self) -> tuple[int, int]:
        return self.encoder.shape

    @property
    def feature(self) -> str:
        return self.source.level

    def bytes_on_disk(self) -> int:
        return 0

    def held_bytes(self) -> int:
        """Bytes of this split's states as float16 in memory."""
        layers, hidden = self.shape
        units = int(self.tokens.lengths.sum()) if self.feature == "tokens" else len(self.tokens)
        return units * layers * hidden * 2

    def _passes(self):
        return sorted_batches(self.tokens.lengths, self.source.settings.batch_size)

    def reading(self, reads: str) -> StreamedSplit:
        """This split's view that gives ``reads`` ('cls' or 'mean') per example."""
        view = copy.copy(self)
        view.reads = reads
        return view

    def example_batch(self, rows: np.ndarray) -> torch.Tensor:
        """(B, L, H) per-example states of ``rows`` as ``reads``, computed now."""
        return self.encoder.encode(self.tokens, rows, self.reads)

    def read_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(per-example states float16 (N, L, H) as ``reads``, labels, idx) in row order, from one pass."""
        layers, hidden = self.shape
        x = np.empty((len(self.tokens), layers, hidden), dtype=np.float16)
        for rows in self._passes():
            x[rows] = self.example_batch(rows).to("cpu", torch.float16).numpy()
        return x, self.tokens.labels, self.tokens.idx

    def read_windows(self) -> WindowStates:
        """Every real token's states of the whole split, in row order (held in memory)."""
        lengths = self.tokens.lengths
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        states = np.empty((int(offsets[-1]), *self.shape), dtype=np.float16)
        for rows in self._passes():
            x, _ = self.encoder.encode(self.tokens, rows, "tokens")
            x = x.to("cpu", torch.float16).numpy()
            for j, i in enumerate(rows):
                states[offsets[i] : offsets[i + 1]] = x[j, : lengths[i]]
        char_offsets = None if self.tokens.offsets is None else np.concatenate(self.tokens.offsets)
        return WindowStates(states, offsets, char_offsets, self.tokens.labels, self.tokens.idx)

    def windows(self, rows: np.ndarray | None = None) -> StreamedWindows:
        return StreamedWindows(self, np.arange(len(self.tokens)) if rows is None else np.asarray(rows))


class StreamedWindows(WindowBatching):
    """The token-level rows ``rows`` of a streamed split, computed when a batch asks for them:
    the lazy counterpart of ``WindowStates`` (same ``idx``, ``labels``, ``lengths``,
    ``offsets`` and ``padded``)."""

    def __init__(self, split: StreamedSplit, rows: np.ndarray):
        self.split, self.rows = split, rows
        tokens = split.tokens
        self.idx, self.labels, self.lengths = tokens.idx[rows], tokens.labels[rows], tokens.lengths[rows]
        self.offsets = None if tokens.offsets is None else [tokens.offsets[r] for r in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def padded(self, rows: np.ndarray):
        """(x (B, T, L, H) float32, mask (B, T), labels) for rows ``rows`` of this view."""
        x, mask = self.split.encoder.encode(self.split.tokens, self.rows[rows], "tokens")
        return x, mask, torch.from_numpy(self.labels[rows])

    def subset(self, rows: np.ndarray) -> StreamedWindows:
        return StreamedWindows(self.split, self.rows[rows])

    def token_chunks(self, batch_size: int):
        """Every real token's states as float16 arrays, batch by batch (for input moments)."""
        for rows in sorted_batches(self.lengths, batch_size):
            x, mask = self.padded(rows)[:2]
            yield x[mask].to("cpu", torch.float16).numpy()


def open_split(source, split: str, verify: str = "sha256"):
    """A split of ``source``: a stored FeatureSet (``source`` = a manifest path, verified) or a
    StreamedSplit (``source`` = a StreamSource)."""
    if isinstance(source, StreamSource):
        return StreamedSplit(source, split)
    return FeatureSet.open(source, split, verify=verify)


def is_streamed(features) -> bool:
    return isinstance(features, StreamedSplit)


def windows_of(features, keep_in_memory_mb: float | None):
    """A split's token-level rows: a stored split's ``WindowStates``; a streamed split's computed
    once and held in memory (float16) when they fit in ``keep_in_memory_mb`` MiB, else a lazy
    ``StreamedWindows`` recomputed at every read (``None``: always lazy, as the training split
    is, streamed every epoch)."""
    if not is_streamed(features):
        return features.read_windows()
    if keep_in_memory_mb is not None and features.held_bytes() <= keep_in_memory_mb * 2**20:
        return features.read_windows()
    return features.windows()
