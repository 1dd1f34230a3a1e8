"""Compare the outputs of two runs of one config (say, before and after a refactoring): every file
of one working directory against the other's, JSON records key by key and tables column by
column, timing fields left out (seconds, wall and CPU time, memory, data-wait shares, and the
cost ratios made from them), safetensors tensor by tensor (their header order varies by
process). Prints what differs and exits 1 if anything but timings does.

    python scripts/compare_runs.py BEFORE_WORKDIR AFTER_WORKDIR
"""

from __future__ import annotations

import filecmp
import json
import re
import sys
from pathlib import Path

import pandas as pd
from safetensors.numpy import load_file

TIMING = re.compile(r"second|time|wait_share|_s$|_s_|elapsed|wall|cpu|rss|memory|mib|started|finished|date", re.I)
COST_COLUMNS = re.compile(r"cost|whole|own|ratio|×", re.I)
# Snakemake's records, the job logs and benchmark files, the plots' pixels, the study journals
# (the order in which parallel workers took their trials)
SKIPPED = (".snakemake", "logs", "benchmarks")
SKIPPED_SUFFIXES = (".png", ".journal", ".md", ".yaml")


def files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] not in SKIPPED}


def json_differences(before, after, where: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after), key=str):
            if TIMING.search(str(key)) or key == "best_trial":
                continue
            if key not in before or key not in after:
                found.append(f"{where}.{key}: only in {'after' if key in after else 'before'}")
            else:
                found += json_differences(before[key], after[key], f"{where}.{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in json_differences(b, a, f"{where}[{i}]")]
    return [] if before == after else [f"{where}: {str(before)[:80]} vs {str(after)[:80]}"]


def differences(before: Path, after: Path) -> list[str]:
    if before.suffix == ".json":
        return json_differences(json.loads(before.read_text()), json.loads(after.read_text()))
    if before.suffix == ".safetensors":
        b, a = load_file(before), load_file(after)
        return [] if b.keys() == a.keys() and all((b[k] == a[k]).all() for k in b) else ["tensors differ"]
    if before.suffix == ".csv":
        b, a = pd.read_csv(before), pd.read_csv(after)
        if list(b.columns) != list(a.columns) or b.shape != a.shape:
            return ["columns or rows differ"]
        kept = [c for c in b.columns if not TIMING.search(c) and not COST_COLUMNS.search(c)]
        changed = b[kept].compare(a[kept])
        return [] if changed.empty else [changed.to_string()[:2000]]
    return ["bytes differ"]


def main(before_dir: Path, after_dir: Path) -> int:
    b, a = files(before_dir), files(after_dir)
    found = [f"only in {before_dir}: {p}" for p in sorted(b - a)] + [f"only in {after_dir}: {p}" for p in sorted(a - b)]
    for path in sorted(b & a):
        if path.suffix in SKIPPED_SUFFIXES or filecmp.cmp(before_dir / path, after_dir / path, shallow=False):
            continue
        found += [f"{path}: {d}" for d in differences(before_dir / path, after_dir / path)]
    print("\n".join(found) or f"{len(b & a)} files alike apart from timings")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
