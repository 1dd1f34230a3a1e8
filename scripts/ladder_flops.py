"""The ladder side network's forward multiply-adds per token against its encoder's, counted by
torch's FlopCounterMode on one example of 64 tokens (the figures behind docs/results.md's "Per
token, the ladder's forward pass is ... of the encoder's multiply-adds").

    python scripts/ladder_flops.py > docs/results/ladder-flops.txt

The encoders are BertModel configurations of MiniLM-L6's, bert-base's and bert-large's shapes
with random weights (the count depends on the shapes only); the ladder has its registered
defaults (side width hidden/8, two side blocks, every layer, mean pooling)."""

from __future__ import annotations

import argparse

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from bertvision.models.heads import build_head
from bertvision.models.random_encoder import NAMED_SHAPES, RandomShape
from bertvision.script_support import run_script

TOKENS = 64
SHAPES = {"MiniLM-L6 (all-MiniLM-L6-v2)": RandomShape(6, 384, 12, 1536), **NAMED_SHAPES}


def forward_flops(module: torch.nn.Module, *inputs) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        module(*inputs)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    torch.manual_seed(0)
    print(f"forward FLOPs (2 x multiply-adds) for one example of {TOKENS} tokens, torch FlopCounterMode")
    print("| encoder | encoder GFLOPs | ladder GFLOPs | ladder / encoder |")
    print("|---|---:|---:|---:|")
    for name, shape in SHAPES.items():
        config = BertConfig(
            num_hidden_layers=shape.layers,
            hidden_size=shape.hidden,
            num_attention_heads=shape.heads,
            intermediate_size=shape.intermediate,
        )
        encoder = BertModel(config, add_pooling_layer=False).eval()
        ids = torch.randint(1000, 2000, (1, TOKENS))
        encoder_flops = forward_flops(encoder, ids)
        # train mode: in eval, nn.TransformerEncoderLayer takes a fused fast path the counter does not see
        ladder = build_head({"type": "ladder"}, shape.layers + 1, shape.hidden, 2).train()
        states = torch.randn(1, TOKENS, shape.layers + 1, shape.hidden)
        ladder_flops = forward_flops(ladder, states, torch.ones(1, TOKENS, dtype=torch.bool))
        print(f"| {name} | {encoder_flops / 1e9:.3f} | {ladder_flops / 1e9:.4f} | {ladder_flops / encoder_flops:.2%} |")


if __name__ == "__main__":
    run_script(main)
