"""The files that runs' jobs leave, listed for the rules that read them (the tables, plots, race
and bundles): each a pattern of ``bertvision.layout`` formatted with a run's keys."""

from __future__ import annotations

from collections.abc import Iterable

from bertvision import layout as L
from bertvision.config.workflow import WorkflowSettings
from bertvision.jobs import timing_jobs
from bertvision.layout import Run


class RunFiles:
    def __init__(self, settings: WorkflowSettings):
        self.s = settings

    @staticmethod
    def bert_records(runs: Iterable[Run]) -> list[str]:
        """BERT's record at each run's checkpoint: its scores, or at checkpoint 0 its training record."""
        return [run.format(L.CHECKPOINT_FILE, file=L.bert_record_file(run.checkpoint)) for run in runs]

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
