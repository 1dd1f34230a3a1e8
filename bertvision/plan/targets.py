"""The files the workflow's targets and its aggregating rules (tables, plots, the cross-task
table, the bundles) ask for, every one a ``bertvision.layout`` pattern formatted for each model,
task, seed and run the config names."""

from __future__ import annotations

from bertvision import layout as L
from bertvision.config.workflow import WorkflowSettings
from bertvision.jobs import Job, baseline_job, embed_job, peer_job
from bertvision.registry.peers import get_peer
from bertvision.registry.tasks import get_task


class Targets:
    def __init__(self, settings: WorkflowSettings):
        self.s = settings

    def for_every_run(self, pattern: str, tasks=None, checkpoints=None, **extra) -> list[str]:
        """``pattern`` formatted for every model x task x fine-tuning seed x checkpoint."""
        return [run.format(pattern, **extra) for run in self.s.runs(tasks, checkpoints)]

    def raw_dirs(self) -> list[str]:
        return [L.RAW_DIR.format(task=t) for t in self.s.tasks]

    # --- full fine-tuning and the peers
    def baseline_jobs(self) -> list[Job]:
        s = self.s
        return [baseline_job(m, t, seed) for m in s.models for t in s.tasks for seed in s.baseline_seeds]

    def baseline_metrics(self) -> list[str]:
        return [L.BASELINE_FILE.format(**job.keys, file=L.BASELINE_METRICS) for job in self.baseline_jobs()]

    def peer_jobs(self) -> list[Job]:
        """Every peer run: each configured peer that applies to a task, once per seed."""
        s = self.s
        return [peer_job(m, t, p, seed)
                for m in s.models for t in s.tasks for p in s.peers(t) for seed in s.peer_seeds(p)]  # fmt: skip

    def embed_jobs(self) -> list[Job]:
        """One encoding per task whose peers read the sentence embeddings."""
        s = self.s
        return [embed_job(m, t) for m in s.models for t in s.tasks
                if any(get_peer(p).reads_embeddings for p in s.peers(t))]  # fmt: skip

    def peer_metrics(self) -> list[str]:
        return [L.PEER_FILE.format(**job.keys, file=L.PEER_METRICS) for job in self.peer_jobs()]

    def bert_curve_files(self) -> list[str]:
        s = self.s
        return [L.BERT_CURVE_FILE.format(model=m, task=t, seed=seed)
                for m in s.models for t in s.bert_curve_tasks() for seed in s.bert_curve_seeds()]  # fmt: skip

    # --- the experiments
    def subset_head_dirs(self) -> list[str]:
        s = self.s
        return [
            path
            for fraction in s.data_fractions()
            for path in self.for_every_run(
                L.SUBSET_HEADS_DIR, s.data_fraction_tasks(), s.data_fraction_checkpoints(), train_fraction=fraction
            )
        ]

    def transfer_files(self) -> list[str]:
        s = self.s
        return [L.TRANSFER_FILE.format(model=m, task=t, ftseed=seed)
                for m in s.models for t in s.transfer_tasks() for seed in s.ft_seeds]  # fmt: skip

    # --- shared encoders
    def shared_head_dirs(self) -> list[str]:
        return [enc.heads_dir(m, seed, t) for m, enc, seed, t in self.s.shared_pairs()]

    def head_transfer_files(self) -> list[str]:
        s = self.s
        encoders = s.shared_encoders()
        return [L.HEAD_TRANSFER_FILE.format(**encoders[a].keys(m, seed, b))
                for m in s.models for seed in s.shared_ft_seeds for a, b in s.label_transfer_pairs()]  # fmt: skip

    def shared(self) -> list[str]:
        """The cross-task table and the bundle, when shared encoders are configured."""
        s = self.s
        if not s.shared_tasks:
            return []
        return [L.table("cross_task", "md"), L.plot("cross-task")] + [
            L.BUNDLE_DIR.format(model=m, encoder=s.serve_encoder) for m in s.models
        ]

    def serve(self) -> list[str]:
        """Every backbone's picked bundles, and the predictions for each task's unlabelled file."""
        s = self.s
        predicted = [t for t in s.tasks if get_task(t).unlabelled_file]
        return [L.PICKED_BUNDLES_DIR.format(model=m) for m in s.models] + [
            L.PREDICTIONS_FILE.format(model=m, task=t) for m in s.models for t in predicted
        ]
