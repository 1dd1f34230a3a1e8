"""Where a serving process's memory goes as it answers: one bundle's engine (no HTTP) answers
batches of 1-8 random MRPC dev pairs with one pair task (the first of the bundle, or of a set of
bundles, that has one), and every ``--every`` batches prints the resident set and the count of
live Python objects (a Python-level leak would grow the count).

    python scripts/serve_memory.py --bundle bundles/minilm-l6/picked --batches 2000

``--trim`` returns freed heap to the system after each batch (glibc ``malloc_trim``); run with
``ONEDNN_PRIMITIVE_CACHE_CAPACITY=8`` to shrink oneDNN's per-shape kernel cache."""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bertvision.script_support import ScriptError, run_script  # noqa: E402
from bertvision.serving.bundle import bundle_paths, load_bundle  # noqa: E402
from bertvision.serving.engine import Engine  # noqa: E402
from bertvision.serving.items import TextItem  # noqa: E402
from bertvision.serving.settings import ServeSettings  # noqa: E402
from scripts.benchmark_serve import sentence_pairs  # noqa: E402


def takes_pairs(task) -> bool:
    return len(task.text_fields) == 2 and not task.takes_questions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, required=True, help="a bundle with a pair task, or a set of bundles")
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--trim", action="store_true")
    p.add_argument(
        "--pad-multiple", type=int, default=ServeSettings().pad_multiple, help="(serve's; 1: pad to the longest only)"
    )
    args = p.parse_args()
    if not args.bundle.is_dir():
        raise ScriptError(f"{args.bundle}: no such bundle or set of bundles")
    bundles = [load_bundle(path) for path in bundle_paths([args.bundle])]
    with_pairs = [b for b in bundles if any(takes_pairs(t) for t in b.tasks.values())]
    if not with_pairs:
        tasks = ", ".join(name for b in bundles for name in b.tasks)
        raise ScriptError(f"{args.bundle}: no pair task (two texts, no question) to send pairs to; it serves {tasks}")
    engine = Engine(with_pairs[0], "cpu", pad_multiple=args.pad_multiple)
    task = next(t for t in engine.tasks.values() if takes_pairs(t))
    pairs = sentence_pairs(400)
    libc = ctypes.CDLL("libc.so.6") if args.trim else None
    process, rng = psutil.Process(), random.Random(0)
    print("batches  resident MiB  Python objects")
    for i in range(1, args.batches + 1):
        items = [TextItem(tuple(rng.choice(pairs)), {task.name: task.picked}) for _ in range(rng.randint(1, 8))]
        engine.predict(items)
        if libc is not None:
            libc.malloc_trim(0)
        if i % args.every == 0:
            gc.collect()
            print(f"{i:7d}  {process.memory_info().rss / 2**20:12.0f}  {len(gc.get_objects()):14d}", flush=True)


if __name__ == "__main__":
    run_script(main)
