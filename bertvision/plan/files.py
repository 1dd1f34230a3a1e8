"""The files that runs' jobs leave, listed for the rules that read them (head jobs, BERT's
scoring, the tables, plots, race and bundles): each a pattern of ``bertvision.layout`` formatted
with a run's keys. ``keys``: a job's wildcards (or any mapping of them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from bertvision import layout as L
from bertvision.config.workflow import WorkflowSettings
from bertvision.jobs import timing_jobs
from bertvision.layout import Checkpoint, Run


def below_here(paths: Iterable) -> list[str]:
    """Input files outside the artifacts (a user's data, a local backbone), relative where they lie
    below the working directory, so that a moved checkout's run reruns nothing."""
    here = Path.cwd().resolve()
    return [str(p.relative_to(here) if p.is_relative_to(here) else p) for p in (Path(q).resolve() for q in paths)]


class RunFiles:
    def __init__(self, settings: WorkflowSettings):
        self.s = settings

    def run(self, keys: Mapping) -> Run:
        """The run a job's keys name."""
        k = dict(keys)
        return Run(k["model"], k["task"], int(k["ftseed"]), Checkpoint.named(k["checkpoint"]), self.s.store(k["task"]))

    # --- where a head job gets its states: the feature files, or (store: false) the frozen checkpoint
    @staticmethod
    def features(run: Run) -> list[str]:
        """The files a head job reads states from: the run's feature manifest, or its checkpoint's
        weights and the task's tokens when the task streams (no extract or manifest job then)."""
        if run.stored:
            return [run.format(L.MANIFEST)]
        return [run.format(L.CHECKPOINT_FILE, file="model.safetensors"), L.TOKENS_DIR.format(**run.keys)]

    def features_input(self, keys: Mapping) -> list[str]:
        """A head job's states and, for a head that starts from the encoder's own layers
        (init: encoder), its checkpoint's weights (a streamed task's are there already)."""
        run = self.run(keys)
        if run.stored and self.s.heads_read_encoder(run.task):
            return self.features(run) + [run.format(L.CHECKPOINT_FILE, file="model.safetensors")]
        return self.features(run)

    def checkpoint_runs(self, keys: Mapping) -> list[Run]:
        """The run of every checkpoint of a fine-tuning run (cross-checkpoint transfer; checkpoint
        0's is the first fine-tuning seed's, ``WorkflowSettings.run``)."""
        k = dict(keys)
        return [self.s.run(k["model"], k["task"], int(k["ftseed"]), c) for c in self.s.checkpoints]

    def transfer_head_dirs(self, keys: Mapping) -> list[str]:
        """The heads a transfer job applies to every checkpoint: each checkpoint's, and the
        data-fraction heads (trained on a share of the rows) where the task has them."""
        s, runs = self.s, self.checkpoint_runs(keys)
        dirs = self.head_dirs(runs)
        if dict(keys)["task"] in s.data_fraction_tasks():
            subsets = set(s.data_fraction_checkpoints())
            dirs += [run.format(L.SUBSET_HEADS_DIR, train_fraction=fraction)
                     for run in runs if run.checkpoint in subsets for fraction in s.data_fractions()]  # fmt: skip
        return dirs

    # --- BERT's own head at a checkpoint
    def scored_in_extraction(self, keys: Mapping) -> bool:
        """Whether BERT's head at the job's checkpoint is scored from its extraction's pass: where
        the states are stored and the head has trained (not checkpoint 0)."""
        run = self.run(keys)
        return run.stored and run.checkpoint.fraction > 0 and "joint" in self.s.pair_forms(run.task)

    def shard_dirs(self, keys: Mapping) -> list[str]:
        return [L.SHARD_DIR.format(**dict(keys), shard=i, n_shards=self.s.shards) for i in range(self.s.shards)]

    def bert_scoring_inputs(self, keys: Mapping) -> dict:
        """What BERT's scoring reads: the training record, the tokens and raw rows of the scored
        splits, and the extraction's shards (stored states) or the checkpoint's weights."""
        run, k = self.run(keys), dict(keys)
        files = {
            "record": run.format(L.CHECKPOINT_FILE, file=L.TRAIN_RECORD),
            "tokens": L.TOKENS_DIR.format(**k),
            "raw": L.RAW_DIR.format(**k),
        }
        if self.scored_in_extraction(keys):
            return {**files, "shards": self.shard_dirs(keys)}
        return {**files, "model": run.format(L.CHECKPOINT_FILE, file="model.safetensors")}

    def bert_logits_input(self, keys: Mapping) -> list[str] | str:
        """BERT's logits for a head job's ensembles: none at checkpoint 0, whose head has not
        trained, nor where every head reads a pair encoded apart (BERT reads it joint: the service
        combines only a head and BERT of one pass)."""
        k = dict(keys)
        if Checkpoint.named(k["checkpoint"]).fraction == 0 or "joint" not in self.s.pair_forms(k["task"]):
            return []
        return L.CHECKPOINT_FILE.format(**k, file=L.BERT_LOGITS)

    # --- what the tables, plots and bundles read
    @staticmethod
    def bert_records(runs: Iterable[Run]) -> list[str]:
        """BERT's record at each run's checkpoint: its scores, or at checkpoint 0 its training record."""
        return [run.format(L.CHECKPOINT_FILE, file=L.bert_record_file(run.checkpoint)) for run in runs]

    def experiment_bert_records(self, reached: Iterable[Run]) -> list[str]:
        """BERT's record at each run the race ``reached`` and at every checkpoint an experiment
        reads (data fraction, transfer: they fine-tune past where the race stopped), each once."""
        s = self.s
        read = s.runs(s.data_fraction_tasks(), s.data_fraction_checkpoints()) + s.runs(s.transfer_tasks())
        return list(dict.fromkeys(self.bert_records([*reached, *read])))

    @staticmethod
    def head_dirs(runs: Iterable[Run]) -> list[str]:
        return [run.format(L.HEADS_DIR) for run in runs]

    @staticmethod
    def manifests(runs: Iterable[Run]) -> list[str]:
        """The feature manifests of the runs that store their states."""
        return [run.format(L.MANIFEST) for run in runs if run.stored]

    def search_workers(self, runs: Iterable[Run]) -> list[str]:
        """Every search worker's record of these runs (the tables read their jobs' times)."""
        return [
            L.SEARCH_WORKER.format(**run.keys, head=head, worker=worker)
            for run in runs
            for head in self.s.search_heads(run.task)
            for worker in range(self.s.search_workers)
        ]

    def searched_best(self, keys, heads=None) -> dict[str, str]:
        """Head name -> best.json of the heads searched for a task at a checkpoint (``keys``: a
        run's or a job's wildcards; of ``heads`` only, when given)."""
        fields = dict(keys)
        return {
            head: L.SEARCH_BEST.format(**{**fields, "head": head})
            for head in self.s.search_heads(fields["task"])
            if heads is None or head in heads
        }

    def search_results(self, runs: Iterable[Run]) -> list[str]:
        return [path for run in runs for path in self.searched_best(run.keys).values()]

    def for_tables(self, runs: list[Run], race_decisions: list[str]) -> list[str]:
        """What the tables read of one backbone and task: BERT's and the heads' records, the
        manifests, every job's benchmark file, the search workers and the race's decisions."""
        benchmarks = [job.benchmark for job in timing_jobs(runs, self.s.shards)]
        return (
            self.bert_records(runs) + self.head_dirs(runs) + self.manifests(runs) + benchmarks
            + self.search_workers(runs) + race_decisions
        )  # fmt: skip
