"""Two finished runs of one config side by side, the grid (heads.race.protocol: grid) and the race
(racing, the default): job-seconds per rule from every job's Snakemake benchmark file, the ratio of
head selection (train_heads, search_worker and the race's own jobs) and of the whole run, the
head jobs per task (tasks with stored states apart from streamed ones, whose head jobs run the
encoder), and every
task's pick with its dev score, its whole cost against full fine-tuning's and whether the two picks
agree: the same path, or within noise of each other, where a 95% paired bootstrap over dev's rows
(``reporting.significance``, each pick the mean of its seeds' runs) gives an interval of the
race's pick minus the grid's that holds 0; where no interval can be drawn, dev mean ± std ranges
that overlap. Issues 33's and 45's goals are these ratios and agreements.

    python scripts/compare_selection.py GRID_WORKDIR RACING_WORKDIR [GRID_WORKDIR RACING_WORKDIR ...] \
        [--config CONFIG (declares own tasks)]

Several pairs are one config run a part at a time (``--config run_tasks=[TASK]`` beside
configs/cpu-glue.yaml, one task each): their job-seconds are summed and their tasks listed together.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from bertvision.evaluation.ensemble import prediction_column
from bertvision.files import read_json
from bertvision.layout import (
    HEAD_PREDICTIONS,
    HEADS_DIR,
    benchmark_files,
    beside,
    current_benchmark_name,
    head_metrics_files,
    picks_record,
    source_checkpoint,
    table,
)
from bertvision.reporting.picks import read_picks
from bertvision.reporting.results import raced_out
from bertvision.reporting.significance import paired_interval
from bertvision.script_support import add_config_argument, declare_config_tasks, known_task, run_directory, run_script

# the rules whose jobs choose among the candidates (the rest produce them or report them)
SELECTION_RULES = ("train_heads", "search_worker", "search_best", "race_checkpoint")
PICKED = "BERTVision (picked)"
# what a finished run holds that this script reads
RUN_PIECES = ("benchmarks/*/*", table("timing", "csv"), table("cost", "csv"), table("summary", "csv"), picks_record())


def copied_by_retable(path: Path) -> bool:
    """A benchmark file named before c55c270 (``ckpt0.3``) that scripts/retable.py copied under
    today's name (``ckpt-0.3``): the job's seconds are counted from the copy."""
    today = current_benchmark_name(path)
    return today != path and today.exists()


def job_seconds(workdirs: list[Path]) -> pd.Series:
    """Rule -> seconds summed over its jobs' benchmark files (benchmarks/RULE/...) in every run,
    each job's once."""
    rows = []
    every = ((rule, p) for w in workdirs for rule, p in benchmark_files(w) if not copied_by_retable(p))
    for rule, path in every:
        rows.append((rule, float(pd.read_csv(path, sep="\t")["s"].iloc[0])))
    return pd.DataFrame(rows, columns=["rule", "seconds"]).groupby("rule")["seconds"].sum()


def head_jobs_by_task(workdirs: list[Path]) -> pd.DataFrame:
    """Task -> its train_heads job-seconds (the timing table) and whether its states are stored or
    streamed into the head jobs (the cost table), over every run."""
    return pd.concat([_head_jobs(w) for w in workdirs])


def _head_jobs(workdir: Path) -> pd.DataFrame:
    timing = pd.read_csv(workdir / table("timing", "csv"))
    seconds = timing[timing["stage"] == "train_heads"].set_index("task")["seconds"]
    features = pd.read_csv(workdir / table("cost", "csv")).groupby("task")["features"].first()
    return pd.DataFrame({"seconds": seconds, "features": features.reindex(seconds.index)})


def picks(workdirs: list[Path]) -> pd.DataFrame:
    summary = pd.concat([pd.read_csv(w / table("summary", "csv")) for w in workdirs])
    summary = summary.rename(columns={"epoch_fraction": "checkpoint"})  # tables written before the one spelling
    return summary[summary["row"] == PICKED].set_index(["backbone", "task"])


def cell(r) -> str:
    std = "" if pd.isna(r["dev_std"]) else f" ± {r['dev_std']:.3f}"
    return f"{r['model']} @{r['checkpoint']:g}, {r['dev_mean']:.3f}{std}, {r['whole_cost_ratio']:.2f}x"


def picked_runs(workdir: Path) -> dict[tuple, list[tuple[str, str]]]:
    """(backbone, task) -> the (eval predictions file, column) of every run of the picked path
    (``picks.json``): the head runs whose records name its backbone, task, checkpoint and head, not
    raced out; the ensemble's column where the pick is a head + BERT ensemble."""
    heads_dirs = sorted(workdir.glob(HEADS_DIR.format(model="*", task="*", ftseed="*", checkpoint="*")))
    records = [(path, read_json(path)) for path in head_metrics_files(heads_dirs)]
    found = {}
    for p in read_picks(workdir / picks_record()):
        found[(p.backbone, p.task)] = [
            (beside(path, HEAD_PREDICTIONS), prediction_column(p.ensemble))
            for path, r in records
            if (r["source"]["model"], r["task"], source_checkpoint(r), r["head"])
            == (p.backbone, p.task, p.checkpoint, p.head)
            and not raced_out(r)
        ]
    return found


def dev_interval(task: str, racing: list, grid: list) -> tuple[float, float, int] | None:
    """The 95% paired bootstrap interval of the racing pick's dev score minus the grid's, in points,
    and dev's rows; None where it cannot be drawn."""
    spec = known_task(task)
    drawn = paired_interval(spec, racing, grid)
    if drawn is None:
        return None
    scale = 100.0 / spec.metric_scale()
    return drawn[0] * scale, drawn[1] * scale, drawn[2]


def overlap(a, b) -> bool:
    if (a["model"], a["checkpoint"]) == (b["model"], b["checkpoint"]):
        return True
    sa, sb = (0 if pd.isna(x["dev_std"]) else x["dev_std"] for x in (a, b))
    return a["dev_mean"] - sa <= b["dev_mean"] + sb and b["dev_mean"] - sb <= a["dev_mean"] + sa


def ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old else "n/a"


def report(grid: list[Path], racing: list[Path]) -> None:
    seconds = pd.DataFrame({"grid": job_seconds(grid), "racing": job_seconds(racing)}).fillna(0.0)
    print("| rule | grid job-s | racing job-s |\n|---|---|---|")
    for rule, r in seconds.iterrows():
        print(f"| {rule} | {r['grid']:.1f} | {r['racing']:.1f} |")
    sel = seconds.loc[seconds.index.isin(SELECTION_RULES)].sum()
    whole = seconds.sum()
    print(f"\nhead selection ({', '.join(SELECTION_RULES)}): {sel['grid']:.1f} vs {sel['racing']:.1f} job-s, "
          f"{ratio(sel['racing'], sel['grid'])}")  # fmt: skip
    print(f"whole run: {whole['grid']:.1f} vs {whole['racing']:.1f} job-s, {ratio(whole['racing'], whole['grid'])}")
    heads = head_jobs_by_task(grid).assign(seconds_racing=head_jobs_by_task(racing)["seconds"])
    print("\n| task | states | grid train_heads job-s | racing | ratio |\n|---|---|---|---|---|")
    for task, r in heads.iterrows():
        print(f"| {task} | {r['features']} | {r['seconds']:.1f} | {r['seconds_racing']:.1f} | "
              f"{ratio(r['seconds_racing'], r['seconds'])} |")  # fmt: skip
    for kind, part in heads.groupby("features"):
        g, r = part["seconds"].sum(), part["seconds_racing"].sum()
        print(f"train_heads of the tasks with {kind} states: {g:.1f} vs {r:.1f} job-s, {ratio(r, g)}")
    a, b = picks(grid), picks(racing)
    runs_a = {k: v for w in grid for k, v in picked_runs(w).items()}
    runs_b = {k: v for w in racing for k, v in picked_runs(w).items()}
    print(
        "\n| task | grid pick (dev, whole cost) | racing pick (dev, whole cost) | racing - grid, 95% over dev | agree |"
    )
    print("|---|---|---|---|---|")
    for key in a.index.union(b.index):
        left = cell(a.loc[key]) if key in a.index else "—"
        right = cell(b.loc[key]) if key in b.index else "—"
        both = key in a.index and key in b.index
        drawn = dev_interval(key[1], runs_b.get(key, []), runs_a.get(key, [])) if both else None
        interval = "—" if drawn is None else f"{drawn[0]:+.1f} to {drawn[1]:+.1f} ({drawn[2]} rows)"
        if not both:
            agree = "no"
        elif (a.loc[key, "model"], a.loc[key, "checkpoint"]) == (b.loc[key, "model"], b.loc[key, "checkpoint"]):
            agree = "yes: the same path"
        elif drawn is not None:
            agree = (
                "yes: within dev's noise"
                if drawn[0] <= 0 <= drawn[1]
                else f"no: the race's pick {'ahead' if drawn[0] > 0 else 'behind'}, beyond dev's noise"
            )
        else:
            agree = "yes: ranges overlap" if overlap(a.loc[key], b.loc[key]) else "no"
        print(f"| {key[1]} | {left} | {right} | {interval} | {agree} |")
    ratios = b["whole_cost_ratio"].reindex(a.index) / a["whole_cost_ratio"]
    print(
        f"\npicks' whole cost, racing / grid: median {ratios.median():.2f}, range {ratios.min():.2f}-{ratios.max():.2f}"
    )
    print(f"picks' whole cost vs full fine-tuning, racing: median {b['whole_cost_ratio'].median():.2f}x; "
          f"grid: median {a['whole_cost_ratio'].median():.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", type=Path, metavar="GRID_WORKDIR RACING_WORKDIR")
    add_config_argument(parser)
    args = parser.parse_args()
    if len(args.workdirs) % 2:
        parser.error("give the working directories in pairs: GRID_WORKDIR RACING_WORKDIR [...]")
    for workdir in args.workdirs:
        run_directory(workdir, *RUN_PIECES)
    declare_config_tasks(args.config, args.workdirs[0])
    report(args.workdirs[0::2], args.workdirs[1::2])


if __name__ == "__main__":
    run_script(main)
