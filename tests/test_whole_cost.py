"""The whole cost of a pick, worked by hand: records written where and as the stages write them
(fine-tuning checkpoints, full fine-tuning, feature manifests, head runs, search workers and the
jobs' benchmark files), the ``tables`` stage run on them, and every whole-cost figure checked
against arithmetic spelled out here. The whole cost is the jobs' wall time (set-up and loading
included), the own seconds the records': leaving out a fine-tuning job, a checkpoint's
extraction, manifest, head job or search, or full fine-tuning's job changes a figure asserted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertvision.jobs import Job, baseline_job, timing_jobs
from bertvision.layout import (
    BASELINE_FILE,
    BASELINE_METRICS,
    BERT_PREDICTIONS,
    CHECKPOINT_FILE,
    HEAD_METRICS,
    HEAD_PREDICTIONS,
    HEADS_DIR,
    MANIFEST,
    SEARCH_WORKER,
    Checkpoint,
    Run,
    bert_record_file,
    head_run_dir,
)
from bertvision.reporting.candidates import candidate_runs
from bertvision.reporting.choice import choose_picks
from bertvision.reporting.summary import summary_table
from bertvision.reporting.summary_page import summary_markdown
from bertvision.reporting.verdict import verdict
from bertvision.stages.tables import build_tables

MODEL, TASK = "tiny", "mrpc"
CHECKPOINTS = ("0", "0.3", "1")
FT_SEEDS, HEAD_SEEDS, WORKERS = (1, 2), (1, 2), (0, 1)
SHARDS = 2
# fine-tuning seed -> checkpoint -> train_seconds there (one run passes every checkpoint)
FINETUNE = {1: {"0": 0.0, "0.3": 6.0, "1": 20.0}, 2: {"0": 0.0, "0.3": 8.0, "1": 24.0}}
# fine-tuning seed -> checkpoint -> wall seconds of its finetune job (from the checkpoint before)
FINETUNE_JOB = {1: {"0": 2.0, "0.3": 7.0, "1": 15.0}, 2: {"0": 2.0, "0.3": 9.0, "1": 17.0}}
MANIFEST_JOB, HEADS_JOB, SEARCH_BEST_JOB = 0.5, 9.0, 1.0  # every checkpoint's (the heads' records: 8 s)
SCORE_BERT_JOB = 1.5  # BERT's scoring at every checkpoint but 0, from the extraction's outputs
BERT_PASS = 2.5  # the seconds the extraction's pass spent on the scored splits (BERT's share of it)
BASELINE_JOB = {1: 130.0, 2: 140.0}  # full fine-tuning's jobs (records: 120 and 126 s of training)
# (fine-tuning seed, checkpoint) -> wall seconds of its two extract jobs (one per shard)
EXTRACT = {
    (1, "0"): (3.0, 4.0),
    (1, "0.3"): (3.0, 3.0),
    (1, "1"): (4.0, 4.0),
    (2, "0.3"): (3.0, 4.0),
    (2, "1"): (4.0, 5.0),
}
# head -> head seed -> its record's seconds (the same on every checkpoint and fine-tuning seed)
HEAD_SECONDS = {"lp": {1: 1.0, 2: 2.0}, "ap": {1: 2.0, 2: 3.0}}
SEARCH_WORKER_SECONDS = {0: 5.0, 1: 6.0}  # ap is searched on every checkpoint, by two workers


def selection(head: str, checkpoint: str) -> float:
    """The pick is ap on the 0.3-epoch checkpoint (not the largest one); on the untouched
    encoder lp beats ap."""
    return {("ap", "0.3"): 0.80, ("lp", "0"): 0.70, ("ap", "0"): 0.68}.get((head, checkpoint), 0.60)


def write_json(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def write_predictions(path: Path) -> None:
    pd.DataFrame({"split": ["dev", "dev"], "prediction": [0, 1]}).to_parquet(path)


def write_benchmark(job: Job, seconds: float) -> None:
    """A Snakemake benchmark file, as its ``benchmark:`` directive writes one."""
    path = Path(job.benchmark)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:0{int(seconds) % 10}\t100.0\n")


def scores(accuracy: float) -> dict:
    dev = {"accuracy": accuracy, "f1": accuracy, "constant_score": 0.5}
    return {"selection": dict(dev), "dev": dev}


class HandWorked:
    """The record set, written under the current directory (benchmark paths are relative);
    ``searched``: the heads an optuna study chose (each by its two workers and its search_best job)."""

    def __init__(self, root: Path, searched: tuple[str, ...] = ("ap",)):
        self.root, self.searched = root, searched
        # checkpoint 0 (the untouched encoder) is one run, under the first fine-tuning seed, as S.runs gives it
        self.runs = list(
            dict.fromkeys(
                Run(MODEL, TASK, ft, Checkpoint.named(checkpoint)).states_owner(FT_SEEDS[0])
                for ft in FT_SEEDS
                for checkpoint in CHECKPOINTS
            )
        )
        self.bert, self.baselines, self.manifests, self.head_dirs, self.workers = [], [], [], [], []
        for run in self.runs:
            self._checkpoint(run)
        for seed, kept, per_epoch in ((1, 2, 40.0), (2, 3, 42.0)):
            self._baseline(seed, kept, per_epoch)
        baselines = tuple(baseline_job(MODEL, TASK, s) for s in (1, 2))
        for job in timing_jobs(self.runs, SHARDS, baselines):  # every job the timing table reads
            write_benchmark(job, self.wall(job))

    @staticmethod
    def wall(job: Job) -> float:
        k = job.keys
        if job.rule == "extract":
            return EXTRACT[(k["ftseed"], k["checkpoint"].name)][k["shard"]]
        if job.rule == "finetune":
            return FINETUNE_JOB[k["ftseed"]][k["checkpoint"].name]
        if job.rule == "baseline":
            return BASELINE_JOB[k["seed"]]
        return {"feature_manifest": MANIFEST_JOB, "train_heads": HEADS_JOB, "score_bert": SCORE_BERT_JOB}.get(
            job.rule, 1.0
        )

    def _checkpoint(self, run: Run) -> None:
        ft, checkpoint = run.ftseed, run.checkpoint.name
        record = {
            "model": MODEL,
            "task": TASK,
            "seed": ft,
            "checkpoint": float(checkpoint),
            "metrics": None,
            "train_seconds": FINETUNE[ft][checkpoint],
            "encoder_parameters": 1000,
            "device": "cpu",
            "precision": "fp32",
        }
        # checkpoint 0 is not scored: the tables read its training record
        path = write_json(self.root / run.format(CHECKPOINT_FILE, file=bert_record_file(run.checkpoint)), record)
        if run.checkpoint.fraction > 0:
            path = write_json(
                path,
                {**record, "metrics": scores(0.65), "scored_from": "extraction", "extraction_pass_seconds": BERT_PASS},
            )
            write_predictions(path.with_name(BERT_PREDICTIONS))
        self.bert.append(path)
        source = {"model": MODEL, "task": TASK, "ft_seed": ft, "checkpoint": checkpoint}
        shards = [{"bytes": 1000} for _ in range(SHARDS)]
        self.manifests.append(
            write_json(self.root / run.format(MANIFEST), {"source": source, "splits": {"train": {"shards": shards}}})
        )
        heads_dir = self.root / run.format(HEADS_DIR)
        self.head_dirs.append(heads_dir)
        for head, seeds in HEAD_SECONDS.items():
            searched = head in self.searched
            for seed, seconds in seeds.items():
                record = {
                    "task": TASK,
                    "head": head,
                    "seed": seed,
                    "source": source,
                    "parameters": 10,
                    "encoder_parameters": 1000,
                    "parameter_percent": 1.0,
                    "metrics": {**scores(0.75), "selection": {"accuracy": selection(head, checkpoint), "f1": 0.7}},
                    "ensembles": {},
                    "search": {"study": "s", "best_params": {}, "best_value": 0.8, "trials": {}} if searched else None,
                    "seconds": seconds,
                    "own_seconds": seconds,
                    "features_stored": True,
                    "device": "cpu",
                    "states_precision": "fp32",
                }
                out = head_run_dir(heads_dir, head, seed)
                write_predictions(write_json(out / HEAD_METRICS, record).with_name(HEAD_PREDICTIONS))
        for head in self.searched:
            keys = {"model": MODEL, "task": TASK, "ftseed": str(ft), "checkpoint": checkpoint, "head": head}
            for worker, seconds in SEARCH_WORKER_SECONDS.items():
                record = {"study": "s", "storage": "j", "worker": worker, "keys": keys, "space": {}, "trials": []}
                self.workers.append(write_json(self.root / SEARCH_WORKER.format(**keys, worker=worker), record))
                write_benchmark(Job("search_worker", {**keys, "worker": worker}), seconds)
            write_benchmark(Job("search_best", keys), SEARCH_BEST_JOB)

    def _baseline(self, seed: int, kept: int, per_epoch: float) -> None:
        history = [
            {"epoch": e, "train_seconds": per_epoch * e, "selection": {"accuracy": 0.8 + 0.01 * (e == kept)}}
            for e in (1, 2, 3)
        ]
        record = {
            "model": MODEL,
            "task": TASK,
            "seed": seed,
            "best_epoch": kept,
            "epochs": 3,
            "history": history,
            "metrics": scores(0.80 + 0.02 * (seed - 1)),
            "train_seconds": per_epoch * kept,
            "train_seconds_all_epochs": per_epoch * 3,
            "encoder_parameters": 1000,
            "device": "cpu",
            "precision": "fp32",
        }
        path = self.root / BASELINE_FILE.format(model=MODEL, task=TASK, seed=seed, file=BASELINE_METRICS)
        self.baselines.append(write_json(path, record))


@pytest.fixture
def tables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = HandWorked(Path("."))
    out = tmp_path / "results" / "tables"
    build_tables(r.bert, r.head_dirs, r.manifests, r.runs, SHARDS, ["lp", "ap"], out, r.baselines, r.workers)
    return out


def test_the_tables_write_the_pick_the_summary_shows(tables):
    from bertvision.layout import PICKS
    from bertvision.reporting.picks import read_picks

    (pick,) = read_picks(tables / PICKS)
    assert (pick.backbone, pick.task, pick.checkpoint) == (MODEL, TASK, Checkpoint(0.3))
    assert (pick.model, pick.head) == ("ap", "ap")
    # both fine-tuning seeds' ap scored 0.80 on selection at 0.3: the lower seed serves
    assert pick.ensemble is None and pick.ft_seed == 1
    picked = pd.read_csv(tables / "summary.csv").set_index("row").loc["BERTVision (picked)"]
    assert picked["selection_mean"] == pytest.approx(pick.selection_mean)
    assert picked["dev_mean"] == pytest.approx(pick.dev_mean)


def test_the_whole_cost_of_the_pick_counts_everything_run_to_make_it(tables):
    summary = pd.read_csv(tables / "summary.csv").set_index("row")
    picked = summary.loc["BERTVision (picked)"]
    assert (picked["model"], picked["checkpoint"]) == ("ap", 0.3)
    # Checkpoint 0 is one run (the first seed's), and each fine-tuning seed carries half of its
    # extraction, both shards, (3 + 4) and manifest 0.5, its head job 9 and its search 5 + 6 + 1:
    # (7 + 0.5 + 9 + 12) / 2 = 14.25.
    # Fine-tuning seed 1: every fine-tuning job to the largest checkpoint, 1 (2 + 7 + 15 = 24), not
    # only to the pick's 0.3, and BERT's scoring at 0.3 and 1 (its logits feed the ensembles the
    # pick ranks): 2 × 1.5; the later checkpoints' extraction, both shards: (3 + 3) + (4 + 4), their
    # manifests, 2 × 0.5; their head jobs (every head and head seed, with its set-up: 9, not the
    # records' 1 + 2 + 2 + 3): 18; their searches, workers and best: 2 × (5 + 6 + 1) = 24; and the
    # share of checkpoint 0. 24 + 3 + 14 + 1 + 18 + 24 + 14.25 = 98.25.
    shared0 = ((3 + 4) + 0.5 + 9 + (5 + 6 + 1)) / 2
    seed1 = (2 + 7 + 15) + 2 * 1.5 + (3 + 3) + (4 + 4) + 2 * 0.5 + 2 * 9 + 2 * (5 + 6 + 1) + shared0
    # Seed 2 ran its own checkpoint-0 fine-tuning job (its run starts there), not checkpoint 0's
    # extraction or heads: (2 + 9 + 17) + 3 + ((3 + 4) + (4 + 5)) + 1 + 18 + 24 + 14.25 = 104.25.
    seed2 = (2 + 9 + 17) + 2 * 1.5 + (3 + 4) + (4 + 5) + 2 * 0.5 + 2 * 9 + 2 * (5 + 6 + 1) + shared0
    assert (seed1, seed2) == (98.25, 104.25)
    assert picked["whole_seconds"] == pytest.approx(101.25)  # (98.25 + 104.25) / 2
    # sqrt((3² + 3²) / 1); the CSV keeps 6 significant digits
    assert picked["whole_seconds_std"] == pytest.approx(np.sqrt(18), rel=1e-5)
    # Its own seconds, per run: fine-tuning to 0.3 + that checkpoint's extraction + ap's seconds:
    # seed 1: 6 + 6 + (2, 3) = 14, 15; seed 2: 8 + 7 + (2, 3) = 17, 18; mean 16.
    assert picked["seconds"] == pytest.approx(16.0)
    # Full fine-tuning's whole cost is its job, every epoch it trained and scored: 130 and 140 (its
    # own seconds stop at the kept epoch: 2 × 40 = 80 and 3 × 42 = 126).
    full = summary.loc["full fine-tuning"]
    assert full["whole_seconds"] == pytest.approx(135.0) and full["seconds"] == pytest.approx(103.0)
    assert picked["whole_cost_ratio"] == pytest.approx(101.25 / 135, rel=1e-5)
    assert picked["cost_ratio"] == pytest.approx(16 / 103, rel=1e-5)
    # The frozen encoder's best head chose among checkpoint 0's heads only, one run for both
    # fine-tuning seeds: 2 + 7 + 0.5 + 9 + 12 = 30.5, with no spread to measure.
    frozen = summary.loc["frozen encoder (best head)"]
    assert (frozen["model"], frozen["checkpoint"]) == ("lp", 0.0)
    # The untouched encoder is the same for both fine-tuning seeds: its two head seeds' runs count
    # once in n (and in the dev tables).
    assert frozen["n"] == 2 and picked["n"] == 4
    glue = pd.read_csv(tables / "glue.csv")
    at = glue[(glue["split"] == "dev") & (glue["model"] == "lp")].drop_duplicates("checkpoint")
    assert dict(zip(at["checkpoint"], at["n"])) == {0.0: 2, 0.3: 4, 1.0: 4}
    assert frozen["whole_seconds"] == pytest.approx(2 + (3 + 4) + 0.5 + 9 + (5 + 6 + 1))
    assert np.isnan(frozen["whole_seconds_std"])
    # The same pick within a budget of 0.3 epochs (checkpoints 0 and 0.3 only): the fine-tuning
    # jobs to 0.3 and BERT's scoring there, checkpoint 0.3's extraction, manifest, head job and
    # search, and the share of checkpoint 0. Seed 1: (2 + 7) + 1.5 + (3 + 3) + 0.5 + 9 + 12 + 14.25
    # = 52.25; seed 2: (2 + 9) + 1.5 + (3 + 4) + 0.5 + 9 + 12 + 14.25 = 55.25.
    within = summary.loc["BERTVision within a budget"]
    assert (within["model"], within["checkpoint"], within["budget"]) == ("ap", 0.3, 0.3)
    assert within["whole_seconds"] == pytest.approx((52.25 + 55.25) / 2)
    assert within["whole_cost_ratio"] == pytest.approx(53.75 / 135, rel=1e-5)
    # BERT at a checkpoint chooses nothing: its fine-tuning jobs to that checkpoint, its scoring job
    # there and, scored from the extraction's pass, that pass's seconds on the scored splits (not
    # the whole extraction): 2 + 7 + 1.5 + 2.5 = 13 and 2 + 9 + 1.5 + 2.5 = 15 (its own seconds,
    # the records' training to it: 6 and 8).
    bert = summary[summary.index == "BERT at a checkpoint"].set_index("checkpoint")
    assert bert.loc[0.3, "whole_seconds"] == pytest.approx(14.0) and bert.loc[0.3, "seconds"] == pytest.approx(7.0)

    md = (tables / "summary.md").read_text()
    assert "| own seconds | whole seconds |" in md and "| own cost | whole cost |" in md
    assert "| 16.0 ± 1.8 | 101.2 ± 4.2 |" in md  # own: std of 14, 15, 17, 18
    assert "| 103.0 ± 32.5 | 135.0 ± 7.1 |" in md  # full fine-tuning: own 80, 126; whole 130, 140
    assert "| 0.16× | 0.75× |" in md
    assert "| BERTVision (picked, ≤ 0.3 epochs) | 0.3 | ap † |" in md  # searched: said, and what it means
    assert "† its parameters the optuna search's best (search.md), drawn on the selection split" in md
    assert "at 0.75× its whole compute" in md and "of the encoder's parameters (own seconds 0.16×)" in md
    # the same page for the HTML report, which shows HTML but not Markdown: the verdict's words, its tables as tables
    page = (tables / "summary.html").read_text()
    tables_in_md = sum(line.startswith("|---") for line in md.splitlines())
    assert "at 0.75× its whole compute" in page and "<td>0.16×</td>" in page and page.count("<table>") == tables_in_md


def test_the_cost_table_gives_the_whole_cost_at_each_checkpoint_and_over_every_one(tables):
    costs = pd.read_csv(tables / "cost.csv").set_index(["ft_seed", "checkpoint", "model"])
    assert costs.loc[(1, 0.3, "ap"), "search_s"] == pytest.approx(5 + 6 + 1)
    assert costs.loc[(1, 0.3, "lp"), "search_s"] == 0
    # seed 1 at 0.3: fine-tuning jobs 2 + 7 + BERT's scoring 1.5 + extraction 3 + 3 + manifest 0.5
    # + head job 9 + search 12
    assert costs.loc[(1, 0.3, "lp"), "checkpoint_whole_s"] == pytest.approx(9 + 1.5 + 6 + 0.5 + 9 + 12)
    assert costs.loc[(2, 1.0, "ap"), "checkpoint_whole_s"] == pytest.approx(28 + 3 + 9 + 0.5 + 9 + 12)
    assert set(costs.loc[1, "selection_whole_s"]) == {98.25} and set(costs.loc[2, "selection_whole_s"]) == {104.25}
    md = (tables / "cost.md").read_text()
    assert "whole cost of a pick over every checkpoint: 98.2 s" in md
    assert "| 14.5 ± 0.7 | 12.0 | 38.0 |" in md  # ap at 0.3, seed 1: BERTVision s, search s, checkpoint whole s


def streamed_runs(tmp_path: Path, searched_without_times: bool = False) -> pd.DataFrame:
    """One fine-tuning seed, checkpoints 0 and 1, lp streamed (``store: false``): each record's
    seconds are its own work plus an even share of the job's encoder passes."""
    bert, heads = [], []
    for checkpoint, train_seconds in (("0", 0.0), ("1", 20.0)):
        record = {
            "model": MODEL,
            "task": TASK,
            "seed": 1,
            "checkpoint": float(checkpoint),
            "metrics": scores(0.65),
            "train_seconds": train_seconds,
            "encoder_parameters": 1000,
            "device": "cpu",
        }
        bert.append(write_json(tmp_path / f"bert-{checkpoint}.json", record))
        # own 1 and 2 (checkpoint 1) or 1 and 2 with a smaller share (checkpoint 0)
        share = 4.0 if checkpoint == "1" else 3.0
        for seed, own in ((1, 1.0), (2, 2.0)):
            record = {
                "task": TASK,
                "head": "lp",
                "seed": seed,
                "source": {"model": MODEL, "task": TASK, "ft_seed": 1, "checkpoint": checkpoint},
                "parameters": 10,
                "encoder_parameters": 1000,
                "parameter_percent": 1.0,
                "metrics": {**scores(0.75), "selection": {"accuracy": 0.7 + 0.1 * (checkpoint == "1"), "f1": 0.7}},
                "ensembles": {},
                "search": {"study": "s"} if searched_without_times else None,
                "seconds": own + share,
                "own_seconds": own,
                "stream": {"encoder_seconds": 2 * share, "shared_seconds_each": share, "runs_per_pass": 2},
                "features_stored": False,
                "device": "cpu",
            }
            heads.append(write_json(tmp_path / f"head-{checkpoint}-{seed}.json", record))
    baseline = {
        "model": MODEL,
        "task": TASK,
        "seed": 1,
        "best_epoch": 1,
        "epochs": 2,
        "history": [{"epoch": 1, "train_seconds": 30.0}, {"epoch": 2, "train_seconds": 60.0}],
        "metrics": scores(0.80),
        "train_seconds": 30.0,
        "train_seconds_all_epochs": 60.0,
        "encoder_parameters": 1000,
        "device": "cpu",
    }
    # the jobs: fine-tuning 2 and 20, the head jobs 9 and 12 (their records: 9 and 11, the encoder's
    # passes included), full fine-tuning 65, and a stale extraction of checkpoint 1 on disk, which
    # streamed heads never read, so it is not counted
    run = {"task": TASK, "model": MODEL, "ftseed": 1}
    walls = [
        (Job("finetune", {**run, "checkpoint": Checkpoint(0)}), 2.0),
        (Job("finetune", {**run, "checkpoint": Checkpoint(1)}), 20.0),
        (Job("train_heads", {**run, "checkpoint": Checkpoint(0)}), 9.0),
        (Job("train_heads", {**run, "checkpoint": Checkpoint(1)}), 12.0),
        (Job("baseline", {"task": TASK, "model": MODEL, "seed": 1}), 65.0),
        (Job("extract", {**run, "checkpoint": Checkpoint(1), "shard": 0}), 9.0),
    ]
    for job, seconds in walls:
        write_benchmark(job, seconds)
    runs = candidate_runs([write_json(tmp_path / "full.json", baseline)], bert, heads, [], [job for job, _ in walls])
    return summary_table(runs, choose_picks(runs))


def test_streamed_states_count_the_encoder_once_and_no_extraction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = streamed_runs(tmp_path)
    picked = table.set_index("row").loc["BERTVision (picked)"]
    assert picked["checkpoint"] == 1.0
    # the fine-tuning jobs to 1 (2 + 20) + the head jobs of checkpoints 0 and 1 (9 + 12), which ran
    # the encoder's passes; no extraction (not the stale 9)
    assert picked["whole_seconds"] == pytest.approx(2 + 20 + 9 + 12)
    assert picked["whole_cost_ratio"] == pytest.approx(43 / 65)  # full fine-tuning: its job
    # its own seconds: fine-tuning to 1 (20) + lp's records (1 + 4, 2 + 4), mean 25.5
    assert picked["seconds"] == pytest.approx(25.5)


def test_a_searched_head_without_its_workers_times_leaves_the_whole_cost_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = streamed_runs(tmp_path, searched_without_times=True)
    picked = table.set_index("row").loc["BERTVision (picked)"]
    assert np.isnan(picked["whole_seconds"]) and not np.isnan(picked["seconds"])
    words = verdict(table)
    assert "full fine-tuning's own seconds (the whole compute is not in these records)" in words
    assert "whole compute (" not in words
    assert "| 25.5 ± 0.7 |  |" in summary_markdown(table)  # own seconds 25, 26; whole unknown


def test_a_race_stopped_after_a_checkpoint_counts_what_it_ran(tmp_path, monkeypatch):
    """The race between checkpoints (heads.race racing) with min_gain 0.2: ap at 0.3 beats the
    untouched encoder's best (lp, 0.70) by only 0.10, so fine-tuning stops there; the tables get
    the checkpoints the race reached (as the rules give them) and the pick's whole cost is what
    ran: fine-tuning to 0.3, the extraction, heads and searches of checkpoints 0 and 0.3."""
    from bertvision.config.settings import RaceSettings
    from bertvision.registry.tasks import get_task
    from bertvision.stages.race import decide_checkpoint

    monkeypatch.chdir(tmp_path)
    r = HandWorked(Path("."))
    reached = [i for i, run in enumerate(r.runs) if run.checkpoint.name != "1"]
    race = RaceSettings(protocol="racing", rungs=(2,), keep=0.5, min_gain=0.2, checkpoint_rule="gain")
    decisions = []
    for checkpoint in ("0", "0.3"):
        dirs = [r.head_dirs[i] for i in reached if r.runs[i].checkpoint.name == checkpoint]
        out = Path("race") / f"{checkpoint}.json"
        decide_checkpoint(
            get_task(TASK), MODEL, Checkpoint.named(checkpoint), dirs, race, out, decisions[-1] if decisions else None
        )
        decisions.append(out)
        write_benchmark(
            Job("race_checkpoint", {"task": TASK, "model": MODEL, "checkpoint": Checkpoint.named(checkpoint)}), 0.6
        )
    assert [json.loads(d.read_text())["go_on"] for d in decisions] == [True, False]
    tables = tmp_path / "results" / "tables"
    pick = lambda items, per=1: [x for i in reached for x in items[i * per : (i + 1) * per]]  # noqa: E731
    build_tables(pick(r.bert), pick(r.head_dirs), pick(r.manifests), pick(r.runs), SHARDS, ["lp", "ap"], tables,
                 r.baselines, pick(r.workers, len(WORKERS)), race_decisions=decisions)  # fmt: skip
    picked = pd.read_csv(tables / "summary.csv").set_index("row").loc["BERTVision (picked)"]
    assert (picked["model"], picked["checkpoint"]) == ("ap", 0.3)
    # Checkpoint 0, one run whose half each fine-tuning seed carries: its extraction (3 + 4), manifest
    # 0.5, head job 9, search 12 and its race decision 0.6: 29.1 / 2 = 14.55. Seed 1: (2 + 7) + 1.5
    # (BERT's scoring at 0.3) + (3 + 3) + 0.5 + 9 + 12 + half of 0.3's decision (one decision for
    # both fine-tuning seeds) 0.3 + 14.55 = 52.85; seed 2: (2 + 9) + 1.5 + (3 + 4) + 0.5 + 9 + 12 +
    # 0.3 + 14.55 = 55.85. Nothing of checkpoint 1 (the grid's 98.25 and 104.25).
    assert picked["whole_seconds"] == pytest.approx((52.85 + 55.85) / 2)
    assert picked["whole_cost_ratio"] == pytest.approx(54.35 / 135, rel=1e-5)
    md = (tables / "summary.md").read_text()
    assert "Checkpoints raced (the best candidate's mean selection score): 0 (lp 0.700) → 0.3 (ap 0.800)" in md
    assert "fine-tuning stopped after checkpoint 0.3 (best selection 0.8000 vs 0.7000 before: +0.1000 <= 0.2)" in md


def test_a_job_that_ran_without_its_benchmark_file_is_unknown_not_free(tmp_path, monkeypatch):
    """A missing benchmark file counted as 0 s passed every test: a path's whole cost would then be
    a partial sum, cheaper than what was run."""
    from bertvision.reporting.whole_cost import JobSeconds

    monkeypatch.chdir(tmp_path)
    timed, untimed = (
        Job("baseline", {"model": MODEL, "task": TASK, "seed": 1}),
        Job("baseline", {"model": MODEL, "task": TASK, "seed": 2}),
    )
    write_benchmark(timed, 30.0)
    spent = JobSeconds([timed, untimed])
    assert spent.of("baseline", MODEL, TASK, 1) == pytest.approx(30.0)
    assert np.isnan(spent.of("baseline", MODEL, TASK, 2))


def test_a_checkpoints_whole_cost_counts_every_searched_heads_study(tmp_path, monkeypatch):
    """ap and lp both searched, each by its two workers and its search_best job (5 + 6 + 1 = 12 s) on
    every checkpoint: a checkpoint's whole cost, and a pick's over every checkpoint, count both
    studies (counting one of them passed every test where only ap was searched)."""
    monkeypatch.chdir(tmp_path)
    r = HandWorked(Path("."), searched=("ap", "lp"))
    out = tmp_path / "results" / "tables"
    build_tables(r.bert, r.head_dirs, r.manifests, r.runs, SHARDS, ["lp", "ap"], out, r.baselines, r.workers)
    costs = pd.read_csv(out / "cost.csv").set_index(["ft_seed", "checkpoint", "model"])
    assert costs.loc[(1, 0.3, "ap"), "search_s"] == pytest.approx(12) == costs.loc[(1, 0.3, "lp"), "search_s"]
    # seed 1 at 0.3: fine-tuning jobs 2 + 7 + BERT's scoring 1.5 + extraction 3 + 3 + manifest 0.5 +
    # head job 9 + both studies 2 × 12
    assert costs.loc[(1, 0.3, "lp"), "checkpoint_whole_s"] == pytest.approx(9 + 1.5 + 6 + 0.5 + 9 + 2 * 12)
    # over every checkpoint: ap alone's 98.25 and 104.25 plus lp's studies at 0.3 and 1 (2 × 12) and
    # its half of checkpoint 0's (12 / 2)
    assert set(costs.loc[1, "selection_whole_s"]) == {98.25 + 30} and set(costs.loc[2, "selection_whole_s"]) == {
        104.25 + 30
    }
    summary = pd.read_csv(out / "summary.csv").set_index("row")
    assert summary.loc["BERTVision (picked)", "whole_seconds"] == pytest.approx(101.25 + 30)
    # the frozen encoder's best head chose among checkpoint 0's heads: both of its studies
    assert summary.loc["frozen encoder (best head)", "whole_seconds"] == pytest.approx(2 + 7 + 0.5 + 9 + 2 * 12)


def test_the_methods_table_costs_a_candidate_its_own_jobs_with_its_search_and_bert_its_whole_jobs(tables):
    """One BERTVision candidate costs the jobs it needs alone: fine-tuning to its checkpoint with
    BERT's scoring, the checkpoint's extraction and manifest, its search if it was searched, and its
    own seconds; BERT at a checkpoint, its whole jobs (as in the summary)."""
    methods = pd.read_csv(tables / "methods.csv").set_index(["model", "checkpoint"])
    # at 0.3, per fine-tuning seed: (2 + 7 + 1.5) + (3 + 3 + 0.5) = 17 and (2 + 9 + 1.5) + (3 + 4 + 0.5) = 20
    seed1, seed2 = 17.0, 20.0
    # ap, searched (5 + 6 + 1), head seeds' own 2 and 3 s: 31, 32, 34, 35
    ap = [seed + 12 + own for seed in (seed1, seed2) for own in (2.0, 3.0)]
    assert methods.loc[("ap", 0.3), "cost_seconds"] == pytest.approx(np.mean(ap))
    assert methods.loc[("ap", 0.3), "cost_seconds_std"] == pytest.approx(np.std(ap, ddof=1), rel=1e-5)
    # lp, not searched: 18, 19, 21, 22
    assert methods.loc[("lp", 0.3), "cost_seconds"] == pytest.approx(np.mean([18, 19, 21, 22]))
    # BERT at 0.3: its fine-tuning jobs, scoring job and share of the extraction's pass, 13 and 15
    assert methods.loc[("BERT", 0.3), "cost_seconds"] == pytest.approx(14.0)
    assert methods.loc[("BERT", 1.0), "cost_seconds"] == pytest.approx(np.mean([24 + 1.5 + 2.5, 28 + 1.5 + 2.5]))


def test_a_seeds_fine_tuning_job_without_its_time_leaves_a_mean_over_seeds_that_needs_it_unknown(tmp_path, monkeypatch):
    """Fine-tuning seed 2's job to 1 epoch ran without its benchmark file. Whatever needed it is
    unknown for that seed (``JobSeconds``: never 0 s), and so is a mean over the fine-tuning seeds
    (never the other seed's figure alone, a cheaper partial mean): the pick's whole cost over every
    checkpoint, BERT's at 1 epoch and the methods table's cost of a candidate at 1 epoch. What did not
    need it keeps its figures."""
    from bertvision.layout import head_metrics_files
    from bertvision.reporting.methods import method_table
    from bertvision.reporting.whole_cost import search_jobs

    monkeypatch.chdir(tmp_path)
    r = HandWorked(Path("."))
    jobs = timing_jobs(r.runs, SHARDS, tuple(baseline_job(MODEL, TASK, s) for s in (1, 2)))
    (untimed,) = [
        j for j in jobs if j.rule == "finetune" and j.keys["ftseed"] == 2 and j.keys["checkpoint"] == Checkpoint(1)
    ]
    Path(untimed.benchmark).unlink()
    spent = jobs + search_jobs(json.loads(Path(p).read_text()) for p in r.workers)
    runs = candidate_runs(r.baselines, r.bert, head_metrics_files(r.head_dirs), r.manifests, spent)
    summary = summary_table(runs, choose_picks(runs))
    rows = summary.set_index("row")
    picked = rows.loc["BERTVision (picked)"]
    assert (picked["model"], picked["checkpoint"]) == ("ap", 0.3)
    assert np.isnan(picked["whole_seconds"])  # seed 1 alone: 98.25
    assert rows.loc["BERTVision within a budget", "whole_seconds"] == pytest.approx((52.25 + 55.25) / 2)
    bert = summary[summary["row"] == "BERT at a checkpoint"].set_index("checkpoint")
    assert np.isnan(bert.loc[1.0, "whole_seconds"])  # seed 1 alone: 24 + 1.5 + 2.5
    assert bert.loc[0.3, "whole_seconds"] == pytest.approx(14.0)
    methods = method_table(runs).set_index(["model", "checkpoint"])
    assert np.isnan(methods.loc[("ap", 1.0), "cost_seconds"])  # seed 1's runs alone
    assert not methods.loc[("ap", 1.0), "on_front"]
    assert methods.loc[("ap", 0.3), "cost_seconds"] == pytest.approx(33.0)
