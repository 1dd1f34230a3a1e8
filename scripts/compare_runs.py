"""Compare the outputs of two runs of one config (say, before and after a refactoring): every file
of one working directory's artifact folders (``layout.ROOTS``: not the code or the config beside
them) against the other's, JSON records key by key and tables column by
column, timing fields left out (seconds, wall and CPU time, memory, data-wait shares, and the
cost ratios made from them), safetensors tensor by tensor (their header order varies by
process), numpy archives array by array (a JSON string in one key by key), a fine-tuning job's
resume state value by value, and a table's rows in any order (the methods table sorts by cost,
a timing). Prints what differs and exits 1 if anything but timings does.

    python scripts/compare_runs.py BEFORE_WORKDIR AFTER_WORKDIR
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.numpy import load_file

from bertvision.files import read_json
from bertvision.layout import ROOTS
from bertvision.script_support import ScriptError, run_directory, run_script

# a timing field by the words of its name (train_seconds, wall_s, max_rss_mb, data_wait_share, started),
# whole words: a substring would also leave out best.candidate ("date") or a text column "sentiment"
TIMING_WORDS = {"seconds", "s", "time", "times", "elapsed", "wall", "cpu", "rss", "memory", "mib", "wait", "started",
                "finished", "date"}  # fmt: skip
COST_WORDS = {"cost", "whole", "front"}  # cost_ratio, whole_cost_ratio, on_front: the cost-score front
# files of another library, whose keys are not ours (a tokenizer's vocabulary holds "time" and "date")
BYTES_ONLY = ("tokenizer", "special_tokens_map", "vocab")
# the job logs and benchmark files (timings); the plots' pixels, the study journals (the order in
# which parallel workers took their trials), the summary's prose in Markdown and its HTML rendering
SKIPPED = ("logs", "benchmarks")
SKIPPED_SUFFIXES = (".png", ".journal", ".md", ".html", ".yaml")
COMPARED = [root for root in ROOTS if root not in SKIPPED]


def words(name) -> set[str]:
    return set(str(name).lower().split("_"))


def is_timing(name) -> bool:
    return bool(words(name) & TIMING_WORDS)


def files(workdir: Path) -> set[Path]:
    """Every file of ``workdir``'s artifact folders but the logs and benchmarks, relative to it."""
    return {p.relative_to(workdir) for root in COMPARED for p in (workdir / root).rglob("*") if p.is_file()}


def json_differences(before, after, where: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after), key=str):
            if is_timing(key) or key == "best_trial":
                continue
            if key not in before or key not in after:
                found.append(f"{where}.{key}: only in {'after' if key in after else 'before'}")
            else:
                found += json_differences(before[key], after[key], f"{where}.{key}")
        return found
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in json_differences(b, a, f"{where}[{i}]")]
    if isinstance(before, (np.ndarray, torch.Tensor)) or isinstance(after, (np.ndarray, torch.Tensor)):
        return [] if same_arrays(before, after) else [f"{where}: arrays differ"]
    if isinstance(before, float) and isinstance(after, float) and math.isnan(before) and math.isnan(after):
        return []
    return [] if before == after else [f"{where}: {str(before)[:80]} vs {str(after)[:80]}"]


def same_arrays(before, after) -> bool:
    return (
        type(before) is type(after)
        and before.shape == after.shape
        and before.dtype == after.dtype
        and bool((before == after).all())
    )


def array_value(array: np.ndarray):
    """An archive's array, or the record a 0-d string array holds as JSON."""
    if array.dtype.kind == "U" and array.ndim == 0:
        try:
            return json.loads(str(array))
        except json.JSONDecodeError:
            return str(array)
    return array


def differences(before: Path, after: Path) -> list[str]:
    if before.name.startswith(BYTES_ONLY):
        return ["bytes differ"]
    if before.suffix == ".json":
        return json_differences(read_json(before), read_json(after))
    if before.suffix == ".safetensors":
        b, a = load_file(before), load_file(after)
        return [] if b.keys() == a.keys() and all(same_arrays(b[k], a[k]) for k in b) else ["tensors differ"]
    if before.suffix == ".npz":
        with np.load(before) as b, np.load(after) as a:
            return json_differences({k: array_value(b[k]) for k in b.files}, {k: array_value(a[k]) for k in a.files})
    if before.suffix == ".pt":  # our own resume state: numpy random states beside tensors
        return json_differences(torch.load(before, weights_only=False), torch.load(after, weights_only=False))
    if before.suffix == ".csv":
        b, a = pd.read_csv(before), pd.read_csv(after)
        if list(b.columns) != list(a.columns) or b.shape != a.shape:
            return ["columns or rows differ"]
        kept = [c for c in b.columns if not is_timing(c) and not words(c) & COST_WORDS and "×" not in c]
        b, a = (t[kept].sort_values(kept, key=lambda c: c.astype(str)).reset_index(drop=True) for t in (b, a))
        changed = b.compare(a)
        return [] if changed.empty else [changed.to_string()[:2000]]
    return ["bytes differ"]


def compare(before_dir: Path, after_dir: Path) -> int:
    b, a = files(before_dir), files(after_dir)
    found = [f"only in {before_dir}: {p}" for p in sorted(b - a)] + [f"only in {after_dir}: {p}" for p in sorted(a - b)]
    for path in sorted(b & a):
        if path.suffix in SKIPPED_SUFFIXES or filecmp.cmp(before_dir / path, after_dir / path, shallow=False):
            continue
        found += [f"{path}: {d}" for d in differences(before_dir / path, after_dir / path)]
    print("\n".join(found) or f"{len(b & a)} files alike apart from timings")
    return 1 if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, metavar="BEFORE_WORKDIR")
    parser.add_argument("after", type=Path, metavar="AFTER_WORKDIR")
    args = parser.parse_args()
    for workdir in (args.before, args.after):
        if not files(run_directory(workdir)):
            raise ScriptError(f"{workdir}: no run outputs to compare (in {', '.join(COMPARED)})")
    return compare(args.before, args.after)


if __name__ == "__main__":
    run_script(main)
