"""scripts/compare_selection.py on two hand-made runs: the ratios issue 33's goals are stated in
(head selection, the whole run, the head jobs of stored and streamed tasks, the picks' whole
cost) worked by hand, and whether two picks agree: the same path, within dev's noise by a paired
bootstrap over the picked runs' dev predictions, or (none kept) by overlapping ranges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from bertvision.files import atomic_write_json
from bertvision.layout import HEAD_METRICS, HEAD_PREDICTIONS, HEADS_DIR, Checkpoint, head_run_dir, picks_record, table
from bertvision.reporting.picks import Pick, write_picks
from tests.test_significance import plant

ROOT = Path(__file__).resolve().parents[1]


def write_run(workdir: Path, jobs: dict, heads: dict, picks: list[dict], shifted: bool = False) -> Path:
    """``jobs``: (rule, task) -> seconds of one job's benchmark file; ``heads``: task -> (train_heads
    seconds, stored or streamed); ``picks``: the summary's picked rows; ``shifted``: the picks' right
    dev rows start a quarter of dev further on (so that two runs' picks disagree on some rows)."""
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
    write_picks([Pick("enc", p["task"], Checkpoint(p["checkpoint"]), p["model"], p["model"], None, 1, 0.0,
                      p["dev_mean"]) for p in picks], workdir / picks_record())  # fmt: skip
    for p in picks:  # each pick's one run: its head record and dev predictions, right on dev_mean of DEV_ROWS
        heads_dir = workdir / HEADS_DIR.format(model="enc", task=p["task"], ftseed=1, checkpoint=p["checkpoint"])
        run = head_run_dir(heads_dir, p["model"], 1)
        run.mkdir(parents=True)
        source = {"model": "enc", "ft_seed": 1, "checkpoint": Checkpoint(p["checkpoint"]).name}
        atomic_write_json({"task": p["task"], "head": p["model"], "source": source}, run / HEAD_METRICS)
        rows = DEV_ROWS[p["task"]]
        plant(run / HEAD_PREDICTIONS, rows, p["dev_mean"], first_right=rows // 4 if shifted else 0)
    return workdir


def pick(task, model, checkpoint, mean, std, ratio):
    return {"task": task, "model": model, "checkpoint": checkpoint, "dev_mean": mean, "dev_std": std,
            "whole_cost_ratio": ratio}  # fmt: skip


# Two tasks, mrpc (stored states) and sst2 (streamed); per protocol: job-seconds per (rule, task),
# train_heads seconds and the pick. Racing's pick of mrpc is another path, 10 points behind on 4,000
# dev rows: beyond dev's noise; its pick of sst2 the same head on another checkpoint, 10 points ahead
# on 40 rows: within it, though beyond the two mean ± std ranges.
DEV_ROWS = {"mrpc": 4000, "sst2": 40}
JOBS = {
    "grid": {("train_heads", "mrpc"): 30.0, ("train_heads", "sst2"): 50.0, ("search_worker", "mrpc"): 20.0,
             ("baseline", "mrpc"): 100.0},
    "racing": {("train_heads", "mrpc"): 9.0, ("train_heads", "sst2"): 25.0, ("search_worker", "mrpc"): 20.0,
               ("race_checkpoint", "mrpc"): 1.0, ("baseline", "mrpc"): 100.0},
}  # fmt: skip
HEADS = {"grid": {"mrpc": (30.0, "stored"), "sst2": (50.0, "streamed")},
         "racing": {"mrpc": (9.0, "stored"), "sst2": (25.0, "streamed")}}  # fmt: skip
PICKS = {"grid": [pick("mrpc", "ap", 1.0, 0.80, 0.01, 1.2), pick("sst2", "lp", 1.0, 0.50, 0.02, 2.0)],
         "racing": [pick("mrpc", "lp", 0.0, 0.70, 0.01, 0.6), pick("sst2", "lp", 0.0, 0.60, 0.02, 0.9)]}  # fmt: skip


def run_of(root: Path, protocol: str, tasks: set[str]) -> Path:
    """The hand-made run of ``protocol`` on ``tasks`` alone."""
    return write_run(
        root / f"{protocol}-{''.join(sorted(tasks))}",
        {key: s for key, s in JOBS[protocol].items() if key[1] in tasks},
        {t: h for t, h in HEADS[protocol].items() if t in tasks},
        [p for p in PICKS[protocol] if p["task"] in tasks],
        shifted=protocol == "racing",
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
    assert "| mrpc | stored | 30.0 | 9.0 | 0.30x |" in out and "| sst2 | streamed | 50.0 | 25.0 | 0.50x |" in out
    assert "tasks with stored states: 30.0 vs 9.0 job-s, 0.30x" in out
    assert "tasks with streamed states: 50.0 vs 25.0 job-s, 0.50x" in out
    assert (
        "| mrpc | ap @1, 0.800 ± 0.010, 1.20x | lp @0, 0.700 ± 0.010, 0.60x | "
        "-11.9 to -8.0 (4000 rows) | no: the race's pick behind, beyond dev's noise |" in out
    )
    assert (
        "| sst2 | lp @1, 0.500 ± 0.020, 2.00x | lp @0, 0.600 ± 0.020, 0.90x | "
        "-12.6 to +35.0 (40 rows) | yes: within dev's noise |" in out
    )
    # racing / grid per pick: 0.5 and 0.45
    assert "median 0.47, range 0.45-0.50" in out
    assert "racing: median 0.75x; grid: median 1.60x" in out


def test_the_ratios_and_the_agreement_worked_by_hand(tmp_path):
    both = {"mrpc", "sst2"}
    assert_worked_by_hand(compare(run_of(tmp_path, "grid", both), run_of(tmp_path, "racing", both)))


def test_one_config_run_a_task_at_a_time_adds_up_to_the_whole(tmp_path):
    pairs = [run_of(tmp_path, protocol, {task}) for task in ("mrpc", "sst2") for protocol in ("grid", "racing")]
    assert_worked_by_hand(compare(*pairs))


def test_an_unpaired_run_is_refused(tmp_path):
    grid = run_of(tmp_path, "grid", {"mrpc"})
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_selection.py"), str(grid)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "GRID_WORKDIR RACING_WORKDIR" in done.stderr


def test_picks_without_dev_predictions_agree_by_their_ranges(tmp_path):
    both = {"mrpc", "sst2"}
    runs = [run_of(tmp_path, protocol, both) for protocol in ("grid", "racing")]
    for predictions in (r for run in runs for r in run.rglob(HEAD_PREDICTIONS)):
        predictions.unlink()  # a run from before predictions were kept
    out = compare(*runs)
    assert "| mrpc | ap @1, 0.800 ± 0.010, 1.20x | lp @0, 0.700 ± 0.010, 0.60x | — | no |" in out
    assert "| sst2 | lp @1, 0.500 ± 0.020, 2.00x | lp @0, 0.600 ± 0.020, 0.90x | — | no |" in out


def test_a_benchmark_file_retable_copied_under_todays_name_counts_once(tmp_path):
    """scripts/retable.py copies a benchmark file named before c55c270 (ckpt0.3) under today's name
    (ckpt-0.3) and keeps the old one: both were counted, the job's seconds twice."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_selection", ROOT / "scripts" / "compare_selection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "benchmarks" / "finetune"
    folder.mkdir(parents=True)
    for name in ("m-sst2-ft1-ckpt0.3.tsv", "m-sst2-ft1-ckpt-0.3.tsv", "m-sst2-ft1-ckpt1.tsv"):
        (folder / name).write_text("s\th:m:s\n100\t0:01:40\n")
    assert module.job_seconds([tmp_path]).to_dict() == {"finetune": 200.0}  # the old-named ckpt1 has no copy
