"""The ``extract`` stage: run a frozen checkpoint over one shard of every split of a task and
store, per example, the [CLS] hidden state and the mean over real tokens of every layer
(embedding output + each encoder layer), or, for span tasks and tasks with ``token_features``
(attrs ``features: tokens``), every real token's states (example tasks keep their per-example
states too). The extractors, one per kind of feature, are ``features.extractors``; this stage
loads the encoder, plans the disk, and writes the shard whole or not at all.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.errors import DiskFullError
from bertvision.features import bert_outputs
from bertvision.features.disk_plan import check_disk_space, planned_bytes, readable_size
from bertvision.features.encode import frozen_encoder, frozen_task_model
from bertvision.features.extractors import (
    ApartStates,
    extract_split_apart,
    extraction_devices,
    extractor,
    feature_level,
)
from bertvision.features.shard_writer import shard_rows
from bertvision.files import disk_full
from bertvision.layout import shard_file, split_file, texts_file
from bertvision.models.encoder_io import hidden_state_shape
from bertvision.registry.states import STATES
from bertvision.runtime.backend import backend_of, backend_precision
from bertvision.runtime.device import set_threads
from bertvision.runtime.precision import computed_in

log = logging.getLogger(__name__)


def extract_shard(
    checkpoint_dir: Path,
    tokens_dir: Path,
    out_dir: Path,
    shard: int,
    n_shards: int,
    splits: list[str],
    settings: ExtractSettings,
    compute: ExtractCompute,
    attrs: dict,
    threads: int | None = None,
    micro_batches: int = 1,
    devices: list[str] | None = None,
    keep_bert_logits: bool = False,
    scored_splits: tuple[str, ...] = (),
) -> dict:
    """Shard ``shard`` of every split -> one HDF5 file per split in ``out_dir``. The files are
    written into a scratch directory beside it, renamed to ``out_dir`` at the end, so a killed
    job leaves no ``out_dir`` behind; the next attempt clears the scratch directory first.
    ``micro_batches`` > 1 (a retry after running out of GPU memory)
    divides the batch size; the features do not depend on it. ``devices``: run a replica of
    the encoder on each (default: every GPU the job was given, else one device). ``keep_bert_logits``:
    run the checkpoint's task model instead of its bare encoder (the same states) and keep its
    head's outputs on the ``scored_splits`` beside the states (``SHARD_BERT_LOGITS``; the pass's
    seconds on each, ``SHARD_BERT_PASS``), so that BERT's own head is scored from this pass
    (``stages/score_bert``) and not from a second one."""
    set_threads(threads)
    settings = settings.replace(batch_size=max(1, -(-settings.batch_size // micro_batches)))

    def load(device):
        if keep_bert_logits:
            return frozen_task_model(checkpoint_dir, attrs["label_kind"], device, compute.backend, compute.precision)
        return frozen_encoder(checkpoint_dir, device, compute.backend, compute.precision)

    # ONNX Runtime runs on the CPU here; auto runs PyTorch on a GPU
    preference = compute.device if compute.backend in ("torch", "auto") else "cpu"
    chosen = [torch.device(d) for d in devices] if devices else extraction_devices(preference)
    replicas = [(load(d), d) for d in chosen]
    model, model_device = replicas[0]
    log.info("extracting on %s", ", ".join(str(d) for _, d in replicas))
    layers, hidden = hidden_state_shape(model)
    kind = attrs["label_kind"]
    backend = backend_of(model)  # auto: what the measurement chose
    attrs = {**attrs, "encoder_dir": str(checkpoint_dir), "backend": backend}
    precision = backend_precision(model_device, compute.precision, model, backend)
    out_dir = Path(out_dir)
    tmp_dir = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    tokens = {split: TokenizedSplit.read(split_file(tokens_dir, split)) for split in splits}
    forms = attrs.get("pair_forms", ["joint"])
    if "joint" not in forms and keep_bert_logits:
        raise ValueError("a pair encoded apart is not BERT's input: its head is scored by its own pass")
    texts = {split: TokenizedSplit.read(texts_file(tokens_dir, split)) for split in splits} if "apart" in forms else {}
    stats, outputs = {}, {}
    try:
        level = feature_level(attrs)
        apart_only = forms == ["apart"] and level == "cls"  # no head reads the joint pair or its tokens
        stored = ["apart"] if apart_only else ["joint", *(["apart"] if "apart" in forms else [])]
        widths = {name: states.width(hidden) for name, states in STATES.items() if states.pair in stored}
        needed = sum(planned_bytes(t, shard, n_shards, layers, hidden, kind, level, widths) for t in tokens.values())
        free = check_disk_space(tmp_dir, needed)
        for split in splits:
            if keep_bert_logits and split in scored_splits:
                outputs[split] = bert_outputs.HeadOutputs(
                    tokens[split], *shard_rows(len(tokens[split]), n_shards, shard)
                )
            try:
                out_path, split_attrs = shard_file(tmp_dir, split), {**attrs, "split": split}
                if apart_only:
                    pairs, sides = tokens[split], texts[split]
                    stats[split] = extract_split_apart(
                        replicas, pairs, sides, out_path, shard, n_shards, settings, precision, split_attrs
                    )
                    continue
                apart = None
                if "apart" in forms:
                    rows = shard_rows(len(tokens[split]), n_shards, shard)
                    apart = ApartStates(replicas, tokens[split], texts[split], *rows, settings, precision, split)
                stats[split] = extractor(attrs)(
                    replicas,
                    tokens[split],
                    out_path,
                    shard,
                    n_shards,
                    settings,
                    precision,
                    split_attrs,
                    outputs.get(split),
                    **({"apart": apart} if apart else {}),
                )
            except Exception as err:  # the writer thread's errors come back here too
                if not disk_full(err):
                    raise
                raise DiskFullError(
                    f"{shard_file(out_dir, split)}: the disk filled up while it was written (nothing of the shard "
                    f"is kept): the shard needs about {readable_size(needed)} of features and "
                    f"{readable_size(free)} was free when it began; free space or use more shards on other disks"
                ) from None
        if keep_bert_logits:
            seconds = {split: s["seconds"] for split, s in stats.items()}
            bert_outputs.save(tmp_dir, outputs, seconds, computed_in(precision, backend))
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
