"""Randomly initialised BERT encoders of a named shape: ``random:bert-large``, ``random:bert-base``
or ``random:L-4_H-256_A-4`` (the BERT miniatures' naming: layers, hidden size, attention heads;
the feed-forward is 4 x hidden). They prove shapes, memory and requests without pretrained
weights (configs/paper-shape-smoke.yaml builds BERT-large's shape on a machine without the hub)
and stand in for hub models in tests.

The tokenizer is the default backbone's uncased WordPiece vocabulary (30,522 entries, the same
as bert-base-uncased's). A shape is built once per seed into a cache folder
(``$BERTVISION_CACHE``, else ``~/.cache/bertvision``) and renamed into place when complete, so
concurrent jobs never read a half-written model."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import CacheError, MissingError

RANDOM_PREFIX = "random:"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
VOCAB_SIZE = 30522
SEED = 0


@dataclass(frozen=True)
class RandomShape:
    layers: int
    hidden: int
    heads: int
    intermediate: int

    @property
    def name(self) -> str:
        return f"L-{self.layers}_H-{self.hidden}_A-{self.heads}_I-{self.intermediate}"


NAMED_SHAPES = {
    "bert-base": RandomShape(12, 768, 12, 3072),
    "bert-large": RandomShape(24, 1024, 16, 4096),
}
_MINIATURE = re.compile(r"^L-(\d+)_H-(\d+)_A-(\d+)$")


MAX_POSITIONS = 512  # BERT's, for every random shape


def is_random(ref: str) -> bool:
    return ref.startswith(RANDOM_PREFIX)


def parse_random(ref: str) -> RandomShape:
    """The shape a ``random:`` reference names; MissingError saying what is accepted otherwise."""
    spec = ref[len(RANDOM_PREFIX) :]
    if spec in NAMED_SHAPES:
        return NAMED_SHAPES[spec]
    match = _MINIATURE.match(spec)
    if match:
        layers, hidden, heads = map(int, match.groups())
        if layers >= 1 and hidden >= 1 and heads >= 1 and hidden % heads == 0:
            return RandomShape(layers, hidden, heads, 4 * hidden)
    raise MissingError(
        f"{ref}: not a random encoder shape; use random:{' or random:'.join(NAMED_SHAPES)} or "
        "random:L-<layers>_H-<hidden>_A-<heads> with hidden divisible by heads"
    )


def cache_root() -> Path:
    return Path(os.environ.get("BERTVISION_CACHE") or Path.home() / ".cache" / "bertvision")


def build_random_bert(out_dir: Path, shape: RandomShape, vocab_dir: Path, seed: int = SEED) -> Path:
    """Write a BertModel of ``shape`` with seeded random weights (safetensors) and the tokenizer
    files of ``vocab_dir`` (an uncased BERT vocabulary) into ``out_dir``."""
    import torch
    from transformers import BertConfig, BertModel

    source = Path(vocab_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out_dir / name)
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=MAX_POSITIONS,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        BertModel(config).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def materialize(ref: str, vocab_dir: Path) -> Path:
    """The cached folder of the random encoder ``ref``, built on first use with the tokenizer
    of ``vocab_dir``."""
    shape = parse_random(ref)
    target = cache_root() / "random-encoders" / f"{shape.name}-seed{SEED}"
    if (target / "model.safetensors").exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as err:
        raise CacheError(
            f"{ref}: a random encoder is built once into {target.parent}, which cannot be written ({err.strerror}): "
            "set BERTVISION_CACHE to a writable folder"
        ) from None
    try:
        build_random_bert(staging, shape, vocab_dir)
        try:
            staging.rename(target)
        except OSError:  # another job finished the same build first
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
