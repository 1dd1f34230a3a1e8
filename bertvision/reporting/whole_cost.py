"""The whole cost of a pick: the wall seconds of every job that had to run before the pick could be
made, per fine-tuning seed, from Snakemake's benchmark files (so job set-up, loading the
encoder and the features, and every scoring pass are counted; a head path's own seconds count
only the path itself, from the records).

The summary picks its BERTVision path among every head and head + BERT ensemble on every
checkpoint by mean selection score. Making that pick took, per fine-tuning seed:

- every fine-tuning job up to the largest checkpoint with heads (one job per checkpoint, each
  going on from the one before), and BERT's scoring at each of them (its logits feed the head +
  BERT ensembles the pick ranks);
- every checkpoint's extraction and feature manifest jobs (none for streamed states, whose
  encoder passes are in the head jobs);
- every checkpoint's head-training job (every head and head seed; under racing the runs it
  stopped early included);
- every search study of a searched head (its worker jobs and its search_best job);
- the race's decision jobs (racing), shared evenly by the fine-tuning seeds they decide for.

Checkpoint 0 is the untouched encoder, the same for every fine-tuning seed: its extraction, head
and search jobs run once (under the first seed) and each seed of a pick over later checkpoints
carries an even share of them, as of the race's decisions; every seed's own fine-tuning jobs
start with its own checkpoint-0 job. A pick among checkpoint 0's heads alone rests on that one
run and costs all of it.

Choosing among the heads of one checkpoint only (the frozen encoder's best head) costs the same
sum at that checkpoint, with the fine-tuning jobs up to it; a pick within a budget (every
checkpoint of at most c epochs), the sum over those checkpoints. BERT's own head at a
checkpoint chooses nothing: its whole cost is its fine-tuning jobs up to the checkpoint and its
scoring job there, and, when it was scored from the extraction's pass, the seconds that pass spent
on the scored splits (it computed their states too: an upper bound). Full
fine-tuning's whole cost is its job: every epoch it trained, the selection scoring after each
(the kept epoch is only known after all of them) and its final scoring. Data-fraction and
transfer experiments and shared encoders do not take part in the pick and are left out."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from bertvision.jobs import Job
from bertvision.layout import Checkpoint, source_checkpoint
from bertvision.reporting.timing import read_benchmark

# One fine-tuning run: the unit whose whole cost is summed.
SEED_KEYS = ["backbone", "task", "ft_seed"]
CHECKPOINT_KEYS = [*SEED_KEYS, "checkpoint"]
# Per trained head and seed, the jobs its checkpoint's whole cost sums (JobSeconds.parts): the
# same for every head seed but search_s, the head's own study (0 when it was not searched).
PART_COLUMNS = ["finetune_jobs_s", "extract_jobs_s", "heads_job_s", "search_s", "race_s"]
HEAD_RUN_COLUMNS = [*CHECKPOINT_KEYS, "model", *PART_COLUMNS]
PARTS = ["finetune_s", "extract_s", "heads_s", "search_s", "race_s"]
CHECKPOINT_RULES = ("finetune", "score_bert", "extract", "feature_manifest", "train_heads")
# The jobs of a fine-tuning run counted per checkpoint in its picks' fine-tuning part.
FINETUNE_RULES = ("finetune", "score_bert")


def search_jobs(worker_records: Iterable[dict]) -> list[Job]:
    """The jobs of the search studies behind these worker records (each carries its study's keys
    and its worker number): every worker job and each study's search_best job."""
    jobs: dict[tuple, Job] = {}
    for w in worker_records:
        keys = {**w["keys"], "checkpoint": Checkpoint.named(w["keys"]["checkpoint"])}
        jobs[("worker", *map(str, keys.values()), w["worker"])] = Job("search_worker", {**keys, "worker": w["worker"]})
        jobs.setdefault(("best", *map(str, keys.values())), Job("search_best", keys))
    return list(jobs.values())


def race_jobs(decisions: Iterable[dict]) -> list[Job]:
    """The race_checkpoint jobs behind these decision records."""
    return [
        Job(
            "race_checkpoint", {"task": d["task"], "model": d["model"], "checkpoint": Checkpoint.named(d["checkpoint"])}
        )
        for d in decisions
    ]


def _wall_seconds(job: Job) -> float:
    try:
        return read_benchmark(job)["seconds"]
    except FileNotFoundError:
        return np.nan  # unknown, never 0


class JobSeconds:
    """Wall seconds of the jobs that ran, from their benchmark files, summed by what they belong
    to: a fine-tuning run's checkpoint (one key per rule), a search study, a race decision, a
    full fine-tuning run. A job without a benchmark file makes its sum unknown (NaN)."""

    def __init__(self, jobs: Iterable[Job]):
        self.seconds: dict[tuple, float] = {}
        for job in jobs:
            key = self.key(job)
            if key is not None:
                self.seconds[key] = self.seconds.get(key, 0.0) + _wall_seconds(job)
        # each fine-tuning run's jobs, by checkpoint: (model, task, ft seed) -> [(rule, checkpoint, s)]
        self.finetune_runs: dict[tuple, list[tuple[str, Checkpoint, float]]] = {}
        for (rule, *key), seconds in self.seconds.items():
            if rule in FINETUNE_RULES:
                self.finetune_runs.setdefault(tuple(key[:3]), []).append((rule, key[3], seconds))

    @staticmethod
    def key(job: Job) -> tuple | None:
        k = job.keys
        if job.rule in CHECKPOINT_RULES:
            return (job.rule, k["model"], k["task"], int(k["ftseed"]), Checkpoint.named(str(k["checkpoint"])))
        if job.rule in ("search_worker", "search_best"):
            return (
                "search",
                k["model"],
                k["task"],
                int(k["ftseed"]),
                Checkpoint.named(str(k["checkpoint"])),
                k["head"],
            )
        if job.rule == "race_checkpoint":
            return ("race", k["model"], k["task"], Checkpoint.named(str(k["checkpoint"])))
        if job.rule == "baseline":
            return ("baseline", k["model"], k["task"], int(k["seed"]))
        if job.rule == "peer":
            return ("peer", k["model"], k["task"], k["peer"], int(k["seed"]))
        if job.rule == "embed":
            return ("embed", k["model"], k["task"])
        return None

    def of(self, *key) -> float:
        return self.seconds.get(key, np.nan)

    def extract(self, model: str, task: str, ft_seed: int, checkpoint: Checkpoint) -> float:
        """The extraction jobs of one checkpoint (every shard)."""
        return self.of("extract", model, task, ft_seed, checkpoint)

    def finetune_up_to(
        self, model: str, task: str, ft_seed: int, checkpoint: Checkpoint, rules: tuple[str, ...] = FINETUNE_RULES
    ) -> float:
        """Every fine-tuning job of the run up to and including ``checkpoint``, with BERT's scoring
        at each (``rules``: of those rules only)."""
        runs = self.finetune_runs.get((model, task, ft_seed), [])
        found = [seconds for rule, at, seconds in runs if rule in rules and at.fraction <= checkpoint.fraction]
        return float(sum(found)) if found else np.nan

    def bert_at(self, record: dict, checkpoint: Checkpoint) -> float:
        """BERT's row at ``checkpoint`` (``record``: its scores): the fine-tuning jobs up to it, its
        scoring job there and, scored from the extraction's pass, that pass's seconds on the scored
        splits (the record's ``extraction_pass_seconds``)."""
        model, task, seed = record["model"], record["task"], int(record["seed"])
        seconds = self.finetune_up_to(model, task, seed, checkpoint, ("finetune",))
        seconds += self.of("score_bert", model, task, seed, checkpoint)
        if record.get("scored_from") == "extraction":
            seconds += record["extraction_pass_seconds"]
        return seconds

    def baseline(self, model: str, task: str, seed: int) -> float:
        return self.of("baseline", model, task, int(seed))

    def peer(self, record: dict) -> float:
        """A peer's job (every setting it tried, its choice and its scoring) and, where it read the
        task's shared sentence embeddings, their encoding's job, whole: it needed all of it."""
        model, task = record["model"], record["task"]
        seconds = self.of("peer", model, task, record["peer"], int(record["seed"]))
        return seconds + self.of("embed", model, task) if record.get("shared_encoding") else seconds

    def search(self, record: dict) -> float:
        """The search behind one head record: 0 when the head was not searched, NaN when it was but
        its jobs' times are missing (never silently 0)."""
        if not record.get("search"):
            return 0.0
        src = record["source"]
        return self.of("search", src["model"], record["task"], int(src["ft_seed"]), source_checkpoint(record),
                       record["head"])  # fmt: skip

    def parts(self, record: dict) -> dict:
        """PART_COLUMNS for one head record: the jobs of its checkpoint's whole cost."""
        src = record["source"]
        model, task, ft, checkpoint = src["model"], record["task"], int(src["ft_seed"]), source_checkpoint(record)
        stored = record.get("features_stored", True)
        return {
            "finetune_jobs_s": self.finetune_up_to(model, task, ft, checkpoint),
            "extract_jobs_s": (
                self.extract(model, task, ft, checkpoint) + self.of("feature_manifest", model, task, ft, checkpoint)
            )
            if stored
            else 0.0,
            "heads_job_s": self.of("train_heads", model, task, ft, checkpoint),
            "search_s": self.search(record),
            "race_s": self.seconds.get(("race", model, task, checkpoint), 0.0),  # none under the grid
        }


def checkpoint_spend(head_runs: pd.DataFrame) -> pd.DataFrame:
    """One row per fine-tuning run and checkpoint, from one row per trained head and seed
    (HEAD_RUN_COLUMNS): its fine-tuning jobs up to it, its extraction, its head job, every searched
    head's study, its share of the race's decision, and their sum ``whole_s``."""
    if head_runs.empty:
        return pd.DataFrame(columns=[*CHECKPOINT_KEYS, *PARTS, "head_runs", "whole_s"])
    g = head_runs.groupby(CHECKPOINT_KEYS, sort=True)
    out = g.agg(
        finetune_s=("finetune_jobs_s", "first"),
        extract_s=("extract_jobs_s", "first"),
        heads_s=("heads_job_s", "first"),
        race_s=("race_s", "first"),
        head_runs=("heads_job_s", "size"),
    )
    studies = head_runs.groupby([*CHECKPOINT_KEYS, "model"], sort=True)["search_s"].first()
    out["search_s"] = studies.groupby(CHECKPOINT_KEYS).agg(lambda v: v.sum(skipna=False))
    out = out.reset_index()
    # one decision per checkpoint decides for every fine-tuning seed
    out["race_s"] /= out.groupby(["backbone", "task", "checkpoint"])["ft_seed"].transform("size")
    out["whole_s"] = out[PARTS].sum(axis=1, skipna=False)
    return out


def selection_spend(checkpoints: pd.DataFrame, up_to: float = np.inf) -> pd.DataFrame:
    """One row per fine-tuning run: the whole cost of a pick among every checkpoint of at most
    ``up_to`` epochs (fine-tuning jobs to the largest of them, their extraction, heads, searches
    and race decisions). Checkpoint 0's extraction, heads, searches and decision ran once for
    every fine-tuning seed (``Run.states_owner``): each seed that took part carries an even share."""
    rows = []
    within = checkpoints[checkpoints["checkpoint"] <= up_to]
    for (backbone, task), block in within.groupby(["backbone", "task"], sort=True):
        seeds = sorted(block["ft_seed"].unique())
        untouched = block["checkpoint"] == 0
        shared = {part: block.loc[untouched, part].sum(skipna=False) / len(seeds) for part in PARTS[1:]}
        for seed in seeds:
            g = block[block["ft_seed"] == seed]
            last = g.loc[g["checkpoint"].idxmax()]
            own = g[g["checkpoint"] > 0]
            row = {"backbone": backbone, "task": task, "ft_seed": seed}
            row["finetune_s"] = last["finetune_s"]  # every fine-tuning job of this seed up to the largest
            row.update({part: own[part].sum(skipna=False) + shared[part] for part in PARTS[1:]})
            row["whole_s"] = sum(row[part] for part in PARTS)
            rows.append(row)
    return pd.DataFrame(rows, columns=[*SEED_KEYS, *PARTS, "whole_s"])


def mean_std(values: pd.Series) -> tuple[float, float]:
    """Mean and sample std over fine-tuning seeds (std NaN for one seed; both NaN for none)."""
    values = pd.Series(values, dtype=float)
    if values.empty:
        return np.nan, np.nan
    std = float(values.std(ddof=1)) if len(values) > 1 else np.nan
    return float(values.mean(skipna=False)), std


class SelectionCost:
    """The whole costs of one backbone and task's choices, per fine-tuning seed, from its
    candidate head runs (HEAD_RUN_COLUMNS; other columns are ignored)."""

    def __init__(self, head_runs: pd.DataFrame):
        self.checkpoints = checkpoint_spend(head_runs[HEAD_RUN_COLUMNS] if len(head_runs) else head_runs)
        self.seeds = selection_spend(self.checkpoints)

    def over_checkpoints(self) -> tuple[float, float]:
        """A pick among every head on every checkpoint: mean and std over fine-tuning seeds."""
        return mean_std(self.seeds["whole_s"])

    def up_to(self, fraction: float) -> tuple[float, float]:
        """A pick among every head on the checkpoints of at most ``fraction`` epochs."""
        return mean_std(selection_spend(self.checkpoints, fraction)["whole_s"])

    def at_checkpoint(self, fraction: float) -> tuple[float, float]:
        """A pick among the heads of one checkpoint: mean and std over fine-tuning seeds."""
        at = self.checkpoints[self.checkpoints["checkpoint"] == fraction]
        return mean_std(at["whole_s"])
