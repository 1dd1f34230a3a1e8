"""scripts/compare_selection.py on two hand-made runs: the ratios issue 33's goals are stated in
(head selection, the whole run, the head jobs of stored and streamed tasks, the picks' whole
cost) worked by hand, and whether two picks agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from bertvision.layout import table

ROOT = Path(__file__).resolve().parents[1]


def write_run(workdir: Path, jobs: dict, heads: dict, picks: list[dict]) -> Path:
    """``jobs``: (rule, task) -> seconds of one job's benchmark file; ``heads``: task -> (train_heads
    seconds, stored or streamed); ``picks``: the summary's picked rows."""
    for i, ((rule, task), seconds) in enumerate(jobs.items()):
        path = workdir / "benchmarks" / rule / task / f"job-{i}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")
    (workdir / table("timing", "csv")).parent.mkdir(parents=True, exist_ok=True)
    timing = [{"task": t, "stage": "train_heads", "jobs": 1, "seconds": s} for t, (s, _) in heads.items()]
    pd.DataFrame(timing).to_csv(workdir / table("timing", "csv"), index=False)
    cost = [{"task": t, "model": "lp", "features": kind} for t, (_, kind) in heads.items()]
    pd.DataFrame(cost).to_csv(workdir / table("cost", "csv"), index=False)
    rows = [{"row": "BERTVision (picked)", "backbone": "enc", **p} for p in picks]
    pd.DataFrame(rows).to_csv(workdir / table("summary", "csv"), index=False)
    return workdir


def pick(task, model, checkpoint, mean, std, ratio):
    return {"task": task, "model": model, "checkpoint": checkpoint, "dev_mean": mean, "dev_std": std,
            "whole_cost_ratio": ratio}  # fmt: skip


# Two tasks, a (stored states) and b (streamed); per protocol: job-seconds per (rule, task), train_heads
# seconds and the pick. Racing's pick of a is another path outside the grid's range
# (0.70 + 0.01 < 0.80 - 0.01); its pick of b the same head on another checkpoint, within it.
JOBS = {
    "grid": {("train_heads", "a"): 30.0, ("train_heads", "b"): 50.0, ("search_worker", "a"): 20.0,
             ("baseline", "a"): 100.0},
    "racing": {("train_heads", "a"): 9.0, ("train_heads", "b"): 25.0, ("search_worker", "a"): 20.0,
               ("race_checkpoint", "a"): 1.0, ("baseline", "a"): 100.0},
}  # fmt: skip
HEADS = {"grid": {"a": (30.0, "stored"), "b": (50.0, "streamed")},
         "racing": {"a": (9.0, "stored"), "b": (25.0, "streamed")}}  # fmt: skip
PICKS = {"grid": [pick("a", "ap", 1.0, 0.80, 0.01, 1.2), pick("b", "lp", 1.0, 0.50, 0.02, 2.0)],
         "racing": [pick("a", "lp", 0.0, 0.70, 0.01, 0.6), pick("b", "lp", 0.0, 0.51, 0.02, 0.9)]}  # fmt: skip


def run_of(root: Path, protocol: str, tasks: set[str]) -> Path:
    """The hand-made run of ``protocol`` on ``tasks`` alone."""
    return write_run(
        root / f"{protocol}-{''.join(sorted(tasks))}",
        {key: s for key, s in JOBS[protocol].items() if key[1] in tasks},
        {t: h for t, h in HEADS[protocol].items() if t in tasks},
        [p for p in PICKS[protocol] if p["task"] in tasks],
    )


def compare(*workdirs: Path) -> str:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare_selection.py"), *map(str, workdirs)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def assert_worked_by_hand(out: str) -> None:
    # head selection: (30 + 50 + 20) vs (9 + 25 + 20 + 1) = 100 vs 55; the whole run 200 vs 155
    assert "100.0 vs 55.0 job-s, 0.55x" in out
    assert "whole run: 200.0 vs 155.0 job-s, 0.78x" in out
    assert "| a | stored | 30.0 | 9.0 | 0.30x |" in out and "| b | streamed | 50.0 | 25.0 | 0.50x |" in out
    assert "tasks with stored states: 30.0 vs 9.0 job-s, 0.30x" in out
    assert "tasks with streamed states: 50.0 vs 25.0 job-s, 0.50x" in out
    assert "| a | ap @1, 0.800 ± 0.010, 1.20x | lp @0, 0.700 ± 0.010, 0.60x | no |" in out
    assert "| b | lp @1, 0.500 ± 0.020, 2.00x | lp @0, 0.510 ± 0.020, 0.90x | yes |" in out
    # racing / grid per pick: 0.5 and 0.45
    assert "median 0.47, range 0.45-0.50" in out
    assert "racing: median 0.75x; grid: median 1.60x" in out


def test_the_ratios_and_the_agreement_worked_by_hand(tmp_path):
    both = {"a", "b"}
    assert_worked_by_hand(compare(run_of(tmp_path, "grid", both), run_of(tmp_path, "racing", both)))


def test_one_config_run_a_task_at_a_time_adds_up_to_the_whole(tmp_path):
    pairs = [run_of(tmp_path, protocol, {task}) for task in "ab" for protocol in ("grid", "racing")]
    assert_worked_by_hand(compare(*pairs))


def test_an_unpaired_run_is_refused(tmp_path):
    grid = run_of(tmp_path, "grid", {"a"})
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_selection.py"), str(grid)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "GRID_WORKDIR RACING_WORKDIR" in done.stderr
