"""The methods the workflow compares its picks with (config sections ``baseline``, ``peers`` and
``experiments.bert_curve``): full fine-tuning, its curve and the peer methods, as the rules see
them. A part of ``config.workflow.WorkflowSettings``, which holds the config and the per-task
lookups these use (``layered``, ``pretrained``, ``max_length``, ``task_overrides``)."""

from __future__ import annotations

from bertvision.config.settings import NO_DEVICE, BaselineSettings, CurveSettings, FinetuneCompute, PeerSettings
from bertvision.registry.peers import applicable, get_peer
from bertvision.registry.tasks import get_task


class ComparisonSettings:
    """Full fine-tuning, its curve and the peers (mixed into WorkflowSettings)."""

    config: dict
    source: str

    @property
    def baseline_seeds(self) -> list[int]:
        """Seeds of the full fine-tuning baseline (none when it is disabled)."""
        base = self.config["baseline"]
        return list(base["seeds"]) if base["enabled"] else []

    def baseline(self, model: str, task: str) -> BaselineSettings:
        """The fine-tuning settings of ``task`` with the baseline's own changes on top."""
        base = self.config["baseline"]
        merged = self.layered("finetune.settings", task, base["settings"])
        return BaselineSettings.pick(merged, self.source, backbone=self.pretrained(model), epochs=base["epochs"])

    def configured_peers(self, task: str) -> list[str]:
        """The peers the config names for ``task`` (tasks.<task>.peers, else peers.methods)."""
        own = self.task_overrides(task).get("peers")
        return list(self.config["peers"]["methods"] if own is None else own)

    def peers(self, task: str) -> list[str]:
        """The configured peers that apply to ``task``'s kind (``registry.peers``)."""
        return applicable(self.configured_peers(task), get_task(task))

    def peer_seeds(self, peer: str) -> list[int]:
        """A peer's seeds: peers.seeds, else the baseline's; for a peer whose result does not depend
        on the seed, one, 0 whatever the seeds, so that a change of seeds reruns it not."""
        if get_peer(peer).deterministic:
            return [0]
        return list(self.config["peers"]["seeds"] or self.config["baseline"]["seeds"])

    def peer(self, model: str, task: str, peer: str) -> PeerSettings:
        peers = self.config["peers"]
        own = peers["embedding" if peer == "cosine" else peer]
        method = {"method": peer, **own}
        if peer == "cosine":
            method.pop("regularization")
        if peer in ("embedding", "cosine", "setfit"):
            method["max_length"] = self.max_length(task)
        if peer in ("embedding", "cosine"):
            method["backend"] = self.config["extract"]["backend"]
        optimizer = None
        if get_peer(peer).trains_encoder and peer != "setfit":
            # full fine-tuning's, but for the learning rate, which the method's grid sets
            # (stages/peer.py): a change of full fine-tuning's reruns no peer
            optimizer = self.baseline(model, task).optimizer.replace(learning_rate=own["learning_rates"][0])
        return PeerSettings.from_dict(
            {"backbone": self.pretrained(model), "optimizer": optimizer, "method": method},
            f"{self.source}: peers.{peer}",
        )

    def peer_compute(self, peer: str) -> FinetuneCompute:
        """Where a peer runs: fine-tuning's device and precision, but one that fits on the
        embeddings runs no model (``NO_DEVICE``), so a change to those reruns it not."""
        return NO_DEVICE if get_peer(peer).reads_embeddings else self.finetune_compute()

    def embedding_compute(self) -> FinetuneCompute:
        """The embeddings' device; they are computed in fp32 whatever ``finetune.precision`` says
        (``stages.peer``), so a change to it reruns none."""
        return self.finetune_compute().replace(precision="fp32")

    def embedding(self, model: str, task: str) -> PeerSettings:
        """The encoding the peers that train no encoder share (rule embed): the cosine's settings,
        which are the linear model's without its regularisation, so that changing that reruns no
        encoding."""
        return self.peer(model, task, "cosine")

    def bert_curve(self, model: str, task: str) -> CurveSettings:
        """Full fine-tuning's own settings (``baseline``'s), scored at the curve's points."""
        merged = self.layered("finetune.settings", task, self.config["baseline"]["settings"])
        points = sorted(self.config["experiments"]["bert_curve"]["points"])
        return CurveSettings.pick(merged, self.source, backbone=self.pretrained(model), points=points)

    def bert_curve_tasks(self) -> list[str]:
        return list(self.config["experiments"]["bert_curve"]["tasks"])

    def bert_curve_seeds(self) -> list[int]:
        return list(self.config["experiments"]["bert_curve"]["seeds"])
