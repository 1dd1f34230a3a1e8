"""Typed settings, one pydantic model per stage (``config.stage_settings.StageSettings``).
``config.workflow.WorkflowSettings`` builds them once from the validated config; the rules pass
them to the stages as JSON (so a changed setting reruns exactly the jobs that read it), and the
stages parse that JSON back with the same model. No defaults here: every value comes from the
config, whose defaults live in the schema. Each field names the config key it comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from bertvision.config.stage_settings import Names, Number, Numbers, SpaceValue, StageSettings, setting
from bertvision.data import glue_files, squad_files
from bertvision.data.hub import local_dataset_files
from bertvision.registry.task_spec import UNLABELLED, TaskSpec

# the data shipped in the project's resources/, read where data.glue_dir or data.squad_dir is null
SHIPPED_DATA = {"glue_dir": "glue", "squad_dir": "squad2"}
PROJECT_RESOURCES = Path(__file__).resolve().parents[2] / "resources"


class DownloadSettings(StageSettings):
    """What one task's download reads: a setting the task does not read is null
    (``WorkflowSettings.download``), so that a change to it reruns no download of that task."""

    source: str | None = setting("data.source")  # null: a task of the config's own reads its own source
    # null (the shipped data) stays null in the job's settings: where the project lies is no setting,
    # so a moved checkout, or a run's own working directory (snakemake --directory), reruns nothing
    glue_dir: str | None = setting("data.glue_dir")
    squad_dir: str | None = setting("data.squad_dir")
    hub_repo: str | None = setting("data.hub_repo")
    seed: int = setting("data.seed")
    selection_fraction: Number | None = setting("data.selection_fraction")  # null: an article_split's shares
    train_size: int | None = setting("tasks.<task>.train_size")
    selection_size: int | None = setting("tasks.<task>.selection_size")
    eval_size: int | None = setting("tasks.<task>.eval_size")
    article_split: dict | None = setting("tasks.<task>.article_split")

    def folder(self, key: str) -> Path:
        """``data.glue_dir`` or ``data.squad_dir`` (``key``), the project's shipped data where it is null."""
        given = getattr(self, key)
        return Path(given) if given is not None else PROJECT_RESOURCES / SHIPPED_DATA[key]

    def source_files(self, task: TaskSpec) -> list[Path]:
        """The local files ``task``'s download reads, a local dataset directory's among them (none
        from the hub), so the workflow reruns the download when one of them changes; a MissingError
        naming the folder's key where a split's file is not there."""
        if task.hub:  # a hub task of the config's own: its declaration (a param of the rule) reruns it too
            return local_dataset_files(task.hub_id)
        if task.files:  # not the unlabelled file: the predict job reads it, and a new one reruns that alone
            return [Path(p) for split, p in task.files.files.items() if split != UNLABELLED]
        if self.source == "hub":
            return local_dataset_files(self.hub_repo or task.hub_id)
        if task.squad:
            splits = [self.article_split["from"]] if self.article_split else list(task.squad.files)
            return [squad_files.locate(self.folder("squad_dir"), task.squad.files, s) for s in splits]
        return [glue_files.locate(self.folder("glue_dir"), task, s) for s in task.glue.files]


class TokenizeSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    max_length: int = setting("tasks.<task>.max_length")
    doc_stride: int | None = setting("tasks.<task>.doc_stride")  # span tasks only


class FinetuneCompute(StageSettings):
    """Where fine-tuning runs, and in which precision."""

    device: str = setting("finetune.device")
    precision: str = setting("finetune.precision")


# what a job that runs no model on a device is given for fine-tuning's compute settings (checkpoint
# 0, a peer fitted on the embeddings), so that a change to finetune.device or .precision reruns it not
NO_DEVICE = FinetuneCompute(device="cpu", precision="fp32")


class ExtractCompute(StageSettings):
    """Where extraction runs, in which precision and on which runtime."""

    device: str = setting("extract.device")
    precision: str = setting("extract.precision")
    backend: str = setting("extract.backend")


class OptimizerSettings(StageSettings):
    """AdamW, its linear warmup-decay schedule and its batch: the keys of the config block that the
    field holding it names (``finetune.settings``, ``baseline.settings``) that training reads."""

    learning_rate: Number
    batch_size: int
    warmup_ratio: Number
    weight_decay: Number
    max_grad_norm: Number


class ScoredOptimizerSettings(OptimizerSettings):
    """``OptimizerSettings`` and the batch the trained model is scored with, for the stages that
    score what they train (full fine-tuning, its curve, LoRA and BitFit). Fine-tuning to a
    checkpoint scores nothing (rule score_bert does), so a new scoring batch leaves it as it ran."""

    eval_batch_size: int


class BertScoringSettings(StageSettings):
    """The batch BERT's head is run with where no extraction kept its outputs (streamed states)."""

    eval_batch_size: int = setting("finetune.settings.eval_batch_size")


class FinetuneSettings(StageSettings):
    """What a checkpoint's weights follow from. The other checkpoints are not in it: adding a later
    one leaves the jobs of the earlier ones as they ran. At checkpoint 0, which trains nothing,
    ``optimizer`` and ``schedule_epochs`` are None: a change to them leaves it as it ran."""

    backbone: str = setting("backbones.<model>.pretrained")
    optimizer: OptimizerSettings | None = setting("finetune.settings")
    schedule_epochs: Number | None = setting("finetune.settings.schedule_epochs")  # null: the largest epoch fraction


class BaselineSettings(StageSettings):
    backbone: str = setting("backbones.<model>.pretrained")
    epochs: int = setting("baseline.epochs")
    optimizer: ScoredOptimizerSettings = setting("baseline.settings")


class EmbeddingPeer(StageSettings):
    """The backbone's sentence embedding and a linear model (``registry/peers``)."""

    method: Literal["embedding"]
    regularization: Numbers = setting("peers.embedding.regularization")
    batch_size: int = setting("peers.embedding.batch_size")
    max_length: int = setting("tasks.<task>.max_length")
    backend: str = setting("extract.backend")  # what encodes the texts, as for the heads' states


class CosinePeer(StageSettings):
    """The cosine of two texts' sentence embeddings, no training."""

    method: Literal["cosine"]
    batch_size: int = setting("peers.embedding.batch_size")
    max_length: int = setting("tasks.<task>.max_length")
    backend: str = setting("extract.backend")


class LoraPeer(StageSettings):
    method: Literal["lora"]
    rank: int = setting("peers.lora.rank")
    alpha: Number = setting("peers.lora.alpha")
    dropout: Number = setting("peers.lora.dropout")
    target_modules: Names = setting("peers.lora.target_modules")
    learning_rates: Numbers = setting("peers.lora.learning_rates")
    epochs: int = setting("peers.lora.epochs")


class BitfitPeer(StageSettings):
    method: Literal["bitfit"]
    learning_rates: Numbers = setting("peers.bitfit.learning_rates")
    epochs: int = setting("peers.bitfit.epochs")


class SetfitPeer(StageSettings):
    method: Literal["setfit"]
    learning_rates: Numbers = setting("peers.setfit.learning_rates")
    pairs_per_example: int = setting("peers.setfit.pairs_per_example")
    max_pair_steps: int = setting("peers.setfit.max_pair_steps")
    batch_size: int = setting("peers.setfit.batch_size")
    max_length: int = setting("tasks.<task>.max_length")


PeerMethodSettings = Annotated[
    EmbeddingPeer | CosinePeer | LoraPeer | BitfitPeer | SetfitPeer,
    Field(discriminator="method", json_schema_extra={"config": "peers"}),
]


class PeerSettings(StageSettings):
    """One peer method's run (config ``peers``): its own block, and for the peers that train the
    encoder with BERT's head (LoRA, BitFit) full fine-tuning's optimizer settings, whose learning
    rate the method's own grid replaces."""

    backbone: str = setting("backbones.<model>.pretrained")
    optimizer: ScoredOptimizerSettings | None = setting("baseline.settings")
    method: PeerMethodSettings


class CurveSettings(StageSettings):
    """BERT's own fine-tuning curve (``experiments.bert_curve``): full fine-tuning's training,
    scored at every point."""

    backbone: str = setting("backbones.<model>.pretrained")
    points: Numbers = setting("experiments.bert_curve.points")
    optimizer: ScoredOptimizerSettings = setting("baseline.settings")


class MixtureSettings(StageSettings):
    """Fine-tuning one encoder on several tasks at once (a shared encoder of ``shared.mixtures``)."""

    backbone: str = setting("backbones.<model>.pretrained")
    tasks: Names = setting("shared.mixtures.<name>.tasks")
    epochs: float = setting("shared.mixtures.<name>.epochs")
    optimizer: OptimizerSettings = setting("finetune.settings")


class ExtractSettings(StageSettings):
    batch_size: int = setting("extract.batch_size")
    block_rows: int = setting("extract.block_rows")
    block_tokens: int = setting("extract.block_tokens")


class HeadTrainingSettings(StageSettings):
    learning_rate: Number = setting("heads.training.learning_rate")
    batch_size: int = setting("heads.training.batch_size")
    max_epochs: int = setting("heads.training.max_epochs")
    patience: int = setting("heads.training.patience")
    weight_decay: Number = setting("heads.training.weight_decay")
    warmup_ratio: Number = setting("heads.training.warmup_ratio")
    in_memory_max_mb: Number = setting("heads.training.in_memory_max_mb")
    standardize: bool = setting("heads.training.standardize")


class HeadSettings(StageSettings):
    """One head as a job trains it: its architecture (``heads.models.<name>`` less ``training``)
    and its final training settings (heads.training, then ``tasks.<task>.head_training``, then
    the head's own ``training``), merged once by ``WorkflowSettings.head_settings``."""

    spec: dict = setting("heads.models.<name>")
    training: HeadTrainingSettings = setting("heads.training")

    @staticmethod
    def memory_mb(heads) -> Number:
        """The ``in_memory_max_mb`` of a job that trains ``heads`` together: the smallest any of them allows."""
        return min(head.training.in_memory_max_mb for head in heads)


class HeadRuntimeSettings(StageSettings):
    """Where heads train and how their feature shards are checked."""

    device: str = setting("heads.device")
    verify: str = setting("heads.verify")


class HeadRaceSettings(StageSettings):
    """How a head-training job chooses among its heads (``training.racing``): what its runs
    follow from, so that a setting of the checkpoint race alone reruns no head job."""

    protocol: str = setting("heads.race.protocol")
    rungs: Annotated[tuple[int, ...], Field(strict=False)] = setting("heads.race.rungs")
    keep: Number = setting("heads.race.keep")

    @property
    def racing(self) -> bool:
        return self.protocol == "racing"


class RaceSettings(HeadRaceSettings):
    """``HeadRaceSettings`` and how the race between checkpoints decides (``stages.race``)."""

    min_gain: Number = setting("heads.race.min_gain")
    checkpoint_rule: str = setting("heads.race.checkpoint_rule")


class SearchSettings(StageSettings):
    trials: int = setting("search.trials")
    workers: int = setting("search.workers")
    seed: int = setting("search.seed")
    startup_trials: int = setting("search.startup_trials")
    pruner: dict = setting("search.pruner")
    space: dict[str, dict[str, SpaceValue | list[SpaceValue]]] = setting("search.space")
    head_seed: int = Field(description="The first of heads.seeds: every trial trains with it.")
