"""The workflow config's shared encoders (config section ``shared``): which encoders several
tasks share, the tasks and heads on each, the mixtures' fine-tuning settings and the encoder
``bertvision serve`` loads. A part of ``config.workflow.WorkflowSettings``, which holds the
config and the per-task lookups these use."""

from __future__ import annotations

from bertvision.config.settings import MixtureSettings
from bertvision.layout import Checkpoint, Run, SharedEncoder
from bertvision.registry.tasks import get_task


class SharedEncoderSettings:
    """The ``shared`` section as the rules see it (mixed into WorkflowSettings)."""

    config: dict

    @property
    def shared_tasks(self) -> list[str]:
        return list(self.config["shared"]["tasks"])

    def shared_encoders(self) -> dict[str, SharedEncoder]:
        """Name -> encoder: frozen, each shared task's own checkpoint, each mixture (none
        without shared tasks)."""
        shared = self.config["shared"]
        if not self.shared_tasks:
            return {}
        encoders = {}
        if shared["frozen"]:
            encoders["frozen"] = SharedEncoder(
                "frozen", "frozen", checkpoint=Checkpoint(0), first_ftseed=self.ft_seeds[0]
            )
        if shared["checkpoint"] is not None:
            checkpoint = Checkpoint(shared["checkpoint"])
            encoders.update(
                {
                    t: SharedEncoder(t, "task", source=t, checkpoint=checkpoint, first_ftseed=self.ft_seeds[0])
                    for t in self.shared_tasks
                }
            )
        for name, mixture in shared["mixtures"].items():
            encoders[name] = SharedEncoder(name, "mixture", tasks=tuple(mixture["tasks"]))
        return encoders

    @property
    def shared_ft_seeds(self) -> list[int]:
        wanted = self.config["shared"]["ft_seeds"]
        return self.ft_seeds if wanted is None else list(wanted)

    def shared_pairs(self) -> list[tuple[str, SharedEncoder, int, str]]:
        """Every (model, encoder, fine-tuning seed, task) whose heads the shared mode trains."""
        return [
            (m, enc, s, t)
            for m in self.models
            for enc in self.shared_encoders().values()
            for s in self.shared_ft_seeds
            for t in self.shared_tasks
        ]

    def finished_heads(self, run: Run) -> list[str]:
        """The shared heads of ``run``'s head job when a shared encoder reads that job's heads (the
        frozen encoder's, a shared task's own checkpoint): the job's race must not stop them."""
        read = any(
            enc.reuses_main(t) and enc.main_run(m, s, t).keys == run.keys
            for m, enc, s, t in self.shared_pairs()
            if t == run.task
        )
        return sorted(self.shared_heads(run.task)) if read else []

    def shared_heads(self, task: str) -> dict[str, dict]:
        heads, wanted = self.task_heads(task), self.config["shared"]["heads"]
        return heads if wanted is None else {n: spec for n, spec in heads.items() if n in wanted}

    @property
    def serve_encoder(self) -> str | None:
        """The encoder whose bundle is written (None without shared tasks)."""
        encoders = self.shared_encoders()
        if not encoders:
            return None
        mixtures = [n for n, e in encoders.items() if e.kind == "mixture"]
        return self.config["shared"]["serve"] or (mixtures[0] if mixtures else next(iter(encoders)))

    def mixture(self, model: str, name: str) -> MixtureSettings:
        mixture = self.config["shared"]["mixtures"][name]
        return MixtureSettings.pick(
            self.layered("finetune.settings"),
            self.source,
            backbone=self.pretrained(model),
            tasks=mixture["tasks"],
            epochs=float(mixture["epochs"]),
        )

    def label_transfer_pairs(self) -> list[tuple[str, str]]:
        """(source, target) shared tasks whose labels mean the same: the source's heads are
        applied to the target as they are."""
        if self.config["shared"]["checkpoint"] is None:
            return []
        return [
            (a, b)
            for a in self.shared_tasks
            for b in self.shared_tasks
            if a != b and get_task(a).shares_labels_with(get_task(b))
        ]
