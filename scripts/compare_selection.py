"""Two finished runs of one config side by side, the grid (heads.race.protocol: grid) and the race
(racing, the default): job-seconds per rule from every job's Snakemake benchmark file, the ratio of
head selection (train_heads, search_worker and the race's own jobs) and of the whole run, the
head jobs per task (tasks with stored states apart from streamed ones, whose head jobs run the
encoder), and every
task's pick with its dev score, its whole cost against full fine-tuning's and whether the two picks
agree (the same path, or dev mean ± std ranges that overlap). Issue 33's goals are these ratios.

    python scripts/compare_selection.py GRID_WORKDIR RACING_WORKDIR [GRID_WORKDIR RACING_WORKDIR ...]

Several pairs are one config run a part at a time (``--config run_tasks=[TASK]`` beside
configs/cpu-glue.yaml, one task each): their job-seconds are summed and their tasks listed together.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from bertvision.layout import table

# the rules whose jobs choose among the candidates (the rest produce them or report them)
SELECTION_RULES = ("train_heads", "search_worker", "search_best", "race_checkpoint")
PICKED = "BERTVision (picked)"


def job_seconds(workdirs: list[Path]) -> pd.Series:
    """Rule -> seconds summed over its jobs' benchmark files (benchmarks/RULE/...) in every run."""
    rows = []
    for workdir, path in ((w, p) for w in workdirs for p in sorted((w / "benchmarks").rglob("*.tsv"))):
        rule = path.relative_to(workdir / "benchmarks").parts[0].removesuffix(".tsv")
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


def overlap(a, b) -> bool:
    if (a["model"], a["checkpoint"]) == (b["model"], b["checkpoint"]):
        return True
    sa, sb = (0 if pd.isna(x["dev_std"]) else x["dev_std"] for x in (a, b))
    return a["dev_mean"] - sa <= b["dev_mean"] + sb and b["dev_mean"] - sb <= a["dev_mean"] + sa


def main(*workdirs: str) -> None:
    grid, racing = [Path(w) for w in workdirs[0::2]], [Path(w) for w in workdirs[1::2]]
    seconds = pd.DataFrame({"grid": job_seconds(grid), "racing": job_seconds(racing)}).fillna(0.0)
    print("| rule | grid job-s | racing job-s |\n|---|---|---|")
    for rule, r in seconds.iterrows():
        print(f"| {rule} | {r['grid']:.1f} | {r['racing']:.1f} |")
    sel = seconds.loc[seconds.index.isin(SELECTION_RULES)].sum()
    whole = seconds.sum()
    print(f"\nhead selection ({', '.join(SELECTION_RULES)}): {sel['grid']:.1f} vs {sel['racing']:.1f} job-s, "
          f"{sel['racing'] / sel['grid']:.2f}x")  # fmt: skip
    print(f"whole run: {whole['grid']:.1f} vs {whole['racing']:.1f} job-s, {whole['racing'] / whole['grid']:.2f}x")
    heads = head_jobs_by_task(grid).assign(seconds_racing=head_jobs_by_task(racing)["seconds"])
    print("\n| task | states | grid train_heads job-s | racing | ratio |\n|---|---|---|---|---|")
    for task, r in heads.iterrows():
        print(f"| {task} | {r['features']} | {r['seconds']:.1f} | {r['seconds_racing']:.1f} | "
              f"{r['seconds_racing'] / r['seconds']:.2f}x |")  # fmt: skip
    for kind, part in heads.groupby("features"):
        g, r = part["seconds"].sum(), part["seconds_racing"].sum()
        print(f"train_heads of the tasks with {kind} states: {g:.1f} vs {r:.1f} job-s, {r / g:.2f}x")
    a, b = picks(grid), picks(racing)
    print("\n| task | grid pick (dev, whole cost) | racing pick (dev, whole cost) | agree |\n|---|---|---|---|")
    for key in a.index.union(b.index):
        left = cell(a.loc[key]) if key in a.index else "—"
        right = cell(b.loc[key]) if key in b.index else "—"
        agree = "yes" if key in a.index and key in b.index and overlap(a.loc[key], b.loc[key]) else "no"
        print(f"| {key[1]} | {left} | {right} | {agree} |")
    ratios = b["whole_cost_ratio"].reindex(a.index) / a["whole_cost_ratio"]
    print(
        f"\npicks' whole cost, racing / grid: median {ratios.median():.2f}, range {ratios.min():.2f}-{ratios.max():.2f}"
    )
    print(f"picks' whole cost vs full fine-tuning, racing: median {b['whole_cost_ratio'].median():.2f}x; "
          f"grid: median {a['whole_cost_ratio'].median():.2f}x")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) < 3 or len(sys.argv) % 2 == 0:
        sys.exit(__doc__)
    main(*sys.argv[1:])
