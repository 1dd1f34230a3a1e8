"""What each job asks the scheduler for, computed from the config: the encoder's size (read
from its config), sequence length, batch size, rows per job and shard count. Memory is
host memory (the model, optimizer state, activations and buffers); runtime comes from a FLOP
count at a conservative throughput, plus, for an extraction, its features' bytes at a shared
filesystem's rate. Both grow with the attempt, so a resubmission after an out-of-memory or
timeout failure asks for more (``--retries``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from bertvision.registry.states import PAIR_PARTS, READS

# Interpreter, torch, transformers, pandas: a job's resident floor. Measured (the usage line of
# docs/results/paper-shape-requests.md): 130-700 MB, more when forked from the warm pool, whose
# pages count in the child's resident set.
BASE_MB = 1000
FLOPS = {"gpu": 2e13, "cpu": 2.5e10}  # sustained, well below peak, so that runtimes are upper bounds
MIN_MINUTES = 10
# Bytes a job writes or reads per second on a cluster's shared filesystem, one job alone: a local
# NVMe disk is several times faster, so the runtimes stay upper bounds (a SQuAD shard of
# BERT-large's token states is hundreds of GB: its extraction was asked for 10 minutes).
DISK_BYTES_PER_S = 2e8
# A head job that would ask for more than this on a CPU asks for a GPU when the GPU rules get one
# (token-level heads, span windows and the CNN heads at paper scale; not an MRPC of lp heads).
HEAD_GPU_MINUTES = 120
MEAN_FILL = 0.6  # real tokens / max_length, on average
EVAL_SHARE = 0.15  # selection + dev rows relative to train
# float32 token-level batches a head job holds at once: WindowBatches' queue (4), the one being
# padded, and the trainer's with its standardized copy and the head's activations (3)
TRAINING_BATCHES_HELD = 8
# Rows the encoder sees per configured row at most: a SQuAD question may take more than one
# window; small slices (a smoke run) cap every buffer at what their rows can fill.
WINDOWS_PER_ROW = 2


# Floats kept for the backward per token and layer: ACTIVATION_FLOATS per hidden unit (the
# projections, the 4x feed-forward, norms, dropout masks, bf16 copies) and ATTENTION_FLOATS per
# attention score (scores, softmax, dropout). Set from measured peaks: all-MiniLM-L6-v2's
# fine-tuning at 64, 128 and 256 tokens needs 14 and 5.5 (RTE), BERT-large's at 128-384 tokens
# stays within about 3x of its peak with them (docs/results/cpu-glue-requests.md,
# docs/results/paper-shape-requests.md).
ACTIVATION_FLOATS = 14
ATTENTION_FLOATS = 5.5


@dataclass(frozen=True)
class EncoderShape:
    layers: int
    hidden: int
    vocab: int
    heads: int = 0  # attention heads; 0: unknown, hidden / 64 as in BERT

    @property
    def attention_heads(self) -> int:
        return self.heads or max(1, self.hidden // 64)

    @property
    def parameters(self) -> int:
        return 12 * self.layers * self.hidden**2 + (self.vocab + 514) * self.hidden

    @classmethod
    @functools.cache
    def of(cls, pretrained: str) -> EncoderShape:
        """As the model declares it (``models.backbone.declared_shape``: its reference, or its
        config.json in a local dir, an installed package or the hub cache at a pinned revision); a
        bert-large or bert-base guess from the name where it is nowhere on disk."""
        from bertvision.models.backbone import declared_shape

        shape = declared_shape(pretrained)
        if shape is None:
            return cls(24, 1024, 30522, 16) if "large" in pretrained else cls(12, 768, 30522, 12)
        return cls(shape.layers, shape.hidden, shape.vocab, shape.heads)


def _minutes(flops: float, device: str, attempt: int, disk_bytes: float = 0.0) -> int:
    seconds = 3 * flops / FLOPS[device] + disk_bytes / DISK_BYTES_PER_S
    return attempt * max(MIN_MINUTES, math.ceil(seconds / 60))


def _mb(nbytes: float) -> int:
    return int(math.ceil((BASE_MB + 1.2 * nbytes / 2**20) / 100) * 100)


def loading_request(shape: EncoderShape, attempt: int) -> dict:
    """A job that loads a checkpoint's encoder and trains nothing (a bundle written or run,
    checkpoint 0 saved): its fp32 weights, a copy at another precision, and the one being written.
    The default's bundles peaked at 482-489 MiB against 3,815 MiB asked before (sized as a
    training job; docs/results/default-requests-8a2c9a8.txt)."""
    return {"mem_mb": attempt * _mb(3 * 4 * shape.parameters), "runtime": 15 * attempt}


def linear_peer_request(rows: int, hidden: int, texts: int, attempt: int) -> dict:
    """The embedding peers (a linear model on the task's stored sentence embeddings, rule embed's):
    every row's embeddings, the feature sets built from them (a pair: [u, v, |u-v|, u*v] and
    [|u-v|, u*v, cos], float32) and scikit-learn's float64 copy of the largest for its fit."""
    per_row = hidden * (4 * texts + (6 * 4 + 4 * 8 if texts == 2 else 4 + 8))
    return {"mem_mb": attempt * _mb(rows * (1 + EVAL_SHARE) * per_row), "runtime": attempt * 30}


def encoding_request(shape: EncoderShape, batch_size: int, max_length: int, rows: int, gpus: int, attempt: int) -> dict:
    """One pass over a task's texts without gradients: the weights and one layer's activations of
    a batch at a time (nothing is kept for a backward); on a GPU when the job has one."""
    per_token = ACTIVATION_FLOATS * shape.hidden + ATTENTION_FLOATS * shape.attention_heads * max_length
    tokens = rows * (1 + EVAL_SHARE) * max_length * MEAN_FILL
    return {
        "mem_mb": attempt * _mb(4 * shape.parameters + batch_size * max_length * per_token * 4),
        "runtime": _minutes(2 * shape.parameters * tokens, "gpu" if gpus else "cpu", attempt),
    }


def finetune_request(
    shape: EncoderShape, batch_size: int, max_length: int, rows: int, epochs: float, gpus: int, attempt: int
) -> dict:
    """Host memory: on CPU, weights, gradients, two AdamW moments and a copy of the best
    weights (20 B/parameter) plus the activations of one micro-batch (attempt n splits batches
    into 2^(n-1)) that autograd keeps for the backward; with GPUs those live on the device and
    the host holds the weights while loading and saving checkpoints, in each of torchrun's
    processes (one per GPU), each with its own interpreter."""
    micro = math.ceil(min(batch_size, rows) / 2 ** (attempt - 1))
    per_token = ACTIVATION_FLOATS * shape.hidden + ATTENTION_FLOATS * shape.attention_heads * max_length
    activations = micro * max_length * shape.layers * per_token * 4
    # weights, gradients, two AdamW moments and the best epoch's weights (full fine-tuning keeps them)
    host = 8 * shape.parameters if gpus else 20 * shape.parameters + activations
    tokens = rows * (epochs + EVAL_SHARE * (1 + epochs)) * max_length * MEAN_FILL
    return {
        "mem_mb": attempt * max(gpus, 1) * _mb(host),
        "runtime": _minutes(6 * shape.parameters * tokens, "gpu" if gpus else "cpu", attempt),
    }


def data_request(rows: int, max_length: int, attempt: int) -> dict:
    """Downloading or tokenizing a task: its rows' text and token ids in pandas / numpy."""
    return {"mem_mb": attempt * _mb(rows * (2048 + 16 * max_length)), "runtime": attempt * 30}


def extract_request(
    shape: EncoderShape,
    batch_size: int,
    block_rows: int,
    block_tokens: int,
    max_length: int,
    rows: int,
    shards: int,
    token_level: bool,
    gpus: int,
    attempt: int,
    apart: bool = False,
) -> dict:
    """Host memory: weights, every layer's states of one batch (in float32 on CPU; the
    float16 copy of what is kept with GPUs), and up to 5 blocks of float16 features (one being
    filled, four queued for the writer), never more than the shard's rows can fill; with a pair's
    texts encoded apart (``apart``), each text's pooled states held for the shard and per example
    PAIR_PARTS more of them, and a second pass. Attempt n divides the batch by 2^(n-1)."""
    states = shape.layers + 1
    apart_rows = len(READS) * len(PAIR_PARTS) if apart else 0  # per example, in rows of hidden width
    block = (block_tokens if token_level else len(READS) * block_rows) + apart_rows * block_rows
    block *= states * shape.hidden * 2
    shard_rows = WINDOWS_PER_ROW * rows * (1 + EVAL_SHARE) / shards
    per_row = (max_length if token_level else len(READS)) + apart_rows
    shard_bytes = shard_rows * per_row * states * shape.hidden * 2
    texts_held = 2 * shard_rows * len(READS) * states * shape.hidden * 2 if apart else 0
    batch = math.ceil(min(batch_size, shard_rows) / 2 ** (attempt - 1))
    kept = batch * (max_length if token_level else 1) * states * shape.hidden * 2
    activations = kept if gpus else batch * max_length * states * shape.hidden * 4 * 2
    tokens = rows * (1 + EVAL_SHARE) / shards * max_length * MEAN_FILL
    return {
        "mem_mb": attempt * _mb(4 * shape.parameters + activations + min(5 * block, shard_bytes) + texts_held),
        # its shard written, then read again for the manifest's checksum
        "runtime": _minutes(
            2 * shape.parameters * tokens * (2 if apart else 1), "gpu" if gpus else "cpu", attempt, 2 * shard_bytes
        ),
    }


def heads_request(
    shape: EncoderShape,
    rows: int,
    max_length: int,
    token_level: bool,
    in_memory_max_mb: float,
    n_runs: int,
    max_epochs: int,
    attempt: int,
    streamed: bool = False,
    gpus: int = 0,
    batch_size: int = 32,
    training: bool = True,
    train_fraction: float = 1.0,
    reads_encoder: bool = False,
) -> dict:
    """``rows``: the train split's; a data-fraction job (``train_fraction``) trains on its share
    but reads the held-out splits whole, and token-level states of every row while they fit.
    [CLS] features: the training features as float32 (at most ``in_memory_max_mb``; larger
    ones stream) twice (the data and the next epoch's shuffled copy), plus the held-out splits.
    Stored token-level features: every split as float16 while they fit in ``in_memory_max_mb``,
    else what fits plus a reader's buffers of that bound (``features.token_reader``), and the
    float32 batches in flight (``TRAINING_BATCHES_HELD`` of ``batch_size`` rows of
    ``max_length``, no more than an epoch's batches and two; one for a job that only evaluates,
    ``training`` False). ``streamed`` (``store: false``): no training features are held; instead
    the frozen encoder (its weights and one batch's states) runs a forward pass over the
    training rows every epoch, once more for the input statistics, and once over the held-out
    splits. ``gpus``: the job trains (and streams) on a GPU. ``reads_encoder``: a head starts
    from the encoder's layers (ladder ``init: encoder``), which the job loads and keeps as float32."""
    per_row = (shape.layers + 1) * shape.hidden * 4 * (max_length * MEAN_FILL if token_level else 1)
    bound = in_memory_max_mb * 2**20
    trained = math.ceil(rows * train_fraction)
    held = min(bound, trained * per_row)
    work = n_runs * max_epochs * trained * per_row * 64  # ~ an adapter of width 64 per float, forward + backward
    device = "gpu" if gpus else "cpu"
    encoder = 4 * shape.parameters if reads_encoder else 0
    if token_level and not streamed:
        stored = (1 + EVAL_SHARE) * rows * per_row / 2  # float16
        windows = WINDOWS_PER_ROW * trained
        batch_rows = min(batch_size, windows)
        in_flight = min(TRAINING_BATCHES_HELD, math.ceil(windows / batch_size) + 2) if training else 1
        batches = in_flight * batch_rows * max_length * (shape.layers + 1) * shape.hidden * 4
        buffers = max(bound, batches) if stored > bound else batches
        return {
            "mem_mb": attempt * _mb(encoder + min(stored, bound) + buffers),
            "runtime": _minutes(work, device, attempt),
        }
    if not streamed:
        return {
            "mem_mb": attempt * _mb(encoder + 2 * held + EVAL_SHARE * rows * per_row),
            "runtime": _minutes(work, device, attempt),
        }
    encoder_tokens = (trained * (max_epochs + 1) + rows * EVAL_SHARE) * max_length * MEAN_FILL
    batch_states = min(64, WINDOWS_PER_ROW * trained) * max_length * (shape.layers + 1) * shape.hidden * 4 * 2
    return {
        # the encoder's weights twice: loaded from a checkpoint while the model is built
        "mem_mb": attempt * _mb(encoder + 8 * shape.parameters + batch_states + min(held, EVAL_SHARE * rows * per_row)),
        "runtime": attempt
        * max(
            MIN_MINUTES,
            math.ceil(3 * (2 * shape.parameters * encoder_tokens / FLOPS[device] + work / FLOPS[device]) / 60),
        ),
    }
