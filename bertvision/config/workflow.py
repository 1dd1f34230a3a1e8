"""The validated workflow config as the rules see it: the names to expand over (models, tasks,
checkpoints, heads, seeds), every run, and each stage's typed settings per task (global
settings overridden per task). Everything that can be wrong across keys is checked when it is
built (``config/checks.py``), so a bad config fails the dry run with the key at fault."""

from __future__ import annotations

import copy
from pathlib import Path

from bertvision.config.checks import check
from bertvision.config.comparison_settings import ComparisonSettings
from bertvision.config.declared_tasks import OWN_TASK_KEYS, declared_task, is_declaration
from bertvision.config.schema import read_config, schema_default, validate_config
from bertvision.config.settings import (
    NO_DEVICE,
    BertScoringSettings,
    DownloadSettings,
    ExtractCompute,
    ExtractSettings,
    FinetuneCompute,
    FinetuneSettings,
    HeadRaceSettings,
    HeadRuntimeSettings,
    HeadSettings,
    HeadTrainingSettings,
    RaceSettings,
    SearchSettings,
    TokenizeSettings,
)
from bertvision.config.shared_settings import SharedEncoderSettings
from bertvision.errors import ConfigError
from bertvision.layout import Checkpoint, Run, fraction_name
from bertvision.registry.heads import get_head_type, head_pair, is_token_head, trains_on
from bertvision.registry.states import PAIR_FORMS
from bertvision.registry.task_spec import TaskSpec
from bertvision.registry.tasks import TASKS, declare, get_task, registered_names

# the section of tasks.<task> that changes a settings block for that task
TASK_LAYERS = {"finetune.settings": "finetune", "heads.training": "head_training"}


def load_workflow_config(path: Path) -> dict:
    return validate_config(read_config(path), source=str(path))


def only_run_tasks(config: dict, source: str) -> dict:
    """A validated ``config`` cut to its ``run_tasks`` (unchanged when null): its tasks, the
    experiments' and the shared encoders' task lists keep only those (``shared.serve`` naming a task
    left out takes its default); a name outside ``tasks``,
    or a mixture that trains on a task left out, is a ConfigError."""
    wanted = config.get("run_tasks")
    if wanted is None:
        return config
    configured = list(config["tasks"])
    unknown = [t for t in wanted if t not in configured]
    if unknown:
        raise ConfigError(f"{source}: run_tasks: {', '.join(unknown)} not in tasks ({', '.join(configured)})")
    for name, mixture in config["shared"]["mixtures"].items():
        left_out = [t for t in mixture["tasks"] if t not in wanted]
        if left_out:
            left = ", ".join(left_out)
            raise ConfigError(
                f"{source}: run_tasks: shared.mixtures.{name} trains on {left}, which run_tasks leaves out"
            )
    cut = copy.deepcopy(config)
    cut["tasks"] = {t: block for t, block in config["tasks"].items() if t in wanted}
    for experiment in cut["experiments"].values():
        experiment["tasks"] = [t for t in experiment["tasks"] if t in wanted]
    cut["shared"]["tasks"] = [t for t in cut["shared"]["tasks"] if t in wanted]
    if cut["shared"]["serve"] in configured and cut["shared"]["serve"] not in wanted:
        cut["shared"]["serve"] = None  # a task's encoder this run does not train: the default's instead
    return cut


class WorkflowSettings(SharedEncoderSettings, ComparisonSettings):
    """What a validated config asks for (of its ``run_tasks``, ``only_run_tasks``)."""

    def __init__(self, config: dict, source: str = "config"):
        self.config, self.source = only_run_tasks(config, source), source
        self.declared = self._declare_tasks()
        check(self)

    def _declare_tasks(self) -> list[TaskSpec]:
        """The config's own tasks (``tasks.<name>.files`` or ``.hub``), added to this process's registry; a
        name that is neither registered nor declared is an error."""
        declared = []
        for name, block in self.config["tasks"].items():
            if is_declaration(block):
                try:
                    declared.append(declare(declared_task(name, block)))
                except (ConfigError, ValueError) as err:
                    raise ConfigError(f"{self.source}: {err}") from None
            elif name not in TASKS or TASKS[name].declared:
                registered = ", ".join(sorted(registered_names()))
                raise ConfigError(
                    f"{self.source}: tasks: unknown task {name!r} (the registry has {registered}); declare a task "
                    "of your own with files (or hub), text, label and kind (docs/own-task.md)"
                )
            elif own := [key for key in OWN_TASK_KEYS if key in (block or {})]:
                raise ConfigError(
                    f"{self.source}: tasks.{name}: {', '.join(own)} describe a task of your own (with files or hub); "
                    f"{name} is registered, with its own; declare yours under another name (docs/own-task.md)"
                )
        return declared

    @classmethod
    def from_files(cls, paths: list[Path]) -> WorkflowSettings:
        """A config and its overlays, each over the ones before, as ``snakemake --configfile A B`` merges them."""
        from snakemake.utils import update_config

        config, source = {}, " + ".join(map(str, paths))
        for path in paths:
            update_config(config, read_config(Path(path)))
        return cls(validate_config(config, source=source), source)

    # --- names ---------------------------------------------------------------------------
    @property
    def models(self) -> list[str]:
        return list(self.config["backbones"])

    @property
    def tasks(self) -> list[str]:
        return list(self.config["tasks"])

    @property
    def heads(self) -> list[str]:
        return list(self.config["heads"]["models"])

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return [Checkpoint(f) for f in sorted(self.config["finetune"]["epoch_fractions"])]

    def checkpoint_before(self, checkpoint: Checkpoint) -> Checkpoint | None:
        """The configured checkpoint a fine-tuning job to ``checkpoint`` goes on from (None: the first)."""
        earlier = [c for c in self.checkpoints if c < checkpoint]
        return earlier[-1] if earlier else None

    @property
    def ft_seeds(self) -> list[int]:
        return list(self.config["finetune"]["seeds"])

    @property
    def head_seeds(self) -> list[int]:
        return list(self.config["heads"]["seeds"])

    @property
    def shards(self) -> int:
        return int(self.config["extract"]["shards"])

    @property
    def search_workers(self) -> int:
        return int(self.config["search"]["workers"])

    @property
    def search_storage(self) -> str | None:
        return self.config["search"]["storage"]

    @property
    def threads(self) -> int:
        return int(self.config["resources"]["threads"])

    @property
    def warm_start(self) -> bool:
        return bool(self.config["resources"]["warm_start"])

    @property
    def gpu_rules(self) -> int:
        return int(self.config["resources"]["gpu_rules"])

    def runs(self, tasks=None, checkpoints=None) -> list[Run]:
        """Every model x task x fine-tuning seed x checkpoint whose states and heads are their own
        (of ``tasks`` / ``checkpoints`` only, when given): checkpoint 0 once, under the first
        fine-tuning seed (``Run.states_owner``)."""
        runs = [
            self.run(m, t, s, c)
            for m in self.models
            for t in (self.tasks if tasks is None else tasks)
            for s in self.ft_seeds
            for c in (self.checkpoints if checkpoints is None else checkpoints)
        ]
        return list(dict.fromkeys(runs))

    def run(self, model: str, task: str, ftseed: int, checkpoint: Checkpoint) -> Run:
        """The run that holds the states and heads of fine-tuning seed ``ftseed``'s ``checkpoint``."""
        return Run(model, task, ftseed, checkpoint, self.store(task)).states_owner(self.ft_seeds[0])

    def task_overrides(self, task: str) -> dict:
        return self.config["tasks"].get(task) or {}

    # --- per task ------------------------------------------------------------------------
    def pretrained(self, model: str) -> str:
        return self.config["backbones"][model]["pretrained"]

    def max_length(self, task: str) -> int:
        return int(self.task_overrides(task).get("max_length") or get_task(task).max_length)

    def train_rows(self, task: str) -> int:
        """Rows the training split will hold: the configured subsample or the published size,
        less the selection split."""
        rows = self.task_overrides(task).get("train_size") or get_task(task).train_rows
        return int(rows * (1 - float(self.config["data"]["selection_fraction"])))

    def token_features(self, task: str) -> bool:
        """Whether ``task`` (an example task) stores every real token's states, not only [CLS]."""
        return bool(self.task_overrides(task).get("token_features", schema_default("tasks.<task>.token_features")))

    def pair_forms(self, task: str, heads: dict[str, dict] | None = None) -> tuple[str, ...]:
        """How ``task``'s texts reach the frozen encoder for its per-example heads (``heads``,
        default: all of its own; ``registry.states.PAIR_FORMS``), each form one of them reads: its
        extraction stores each. ('joint',) for a task of one text, or one whose heads all read
        every token."""
        heads = self.task_heads(task) if heads is None else heads
        forms = {head_pair(spec) for spec in heads.values() if not is_token_head(spec)}
        return tuple(form for form in PAIR_FORMS if form in forms) or ("joint",)

    def why_not_apart(self, task: str) -> str | None:
        """Why no head of ``task`` can read a pair's texts encoded apart (None: one can)."""
        if not get_task(task).two_texts:
            return f"{task}'s examples are not pairs of texts"
        if not self.store(task):
            return "store: false streams joint sequences (not built for apart)"
        return None

    def store(self, task: str) -> bool:
        """Whether ``task``'s hidden states are written to feature files (False: streamed into
        its head-training jobs)."""
        return bool(self.task_overrides(task).get("store", self.config["extract"]["store"]))

    def feature_level(self, task: str) -> str:
        """What extraction stores per row: 'tokens' (every real token) or 'cls'."""
        return "tokens" if get_task(task).kind == "span" or self.token_features(task) else "cls"

    def task_heads(self, task: str) -> dict[str, dict]:
        """The head architectures trained for ``task``: the task's ``heads`` list, or all (then
        only those that train on it: token-level heads need ``token_features``, and span tasks
        take sequence heads but no per-example token heads)."""
        models = self.config["heads"]["models"]
        names = self.task_overrides(task).get("heads") or self.heads
        kind = get_task(task).kind
        features = self.token_features(task)
        apart = self.why_not_apart(task) is None
        return {n: dict(models[n]) for n in names if trains_on(models[n], kind, features, apart)}

    def heads_read_encoder(self, task: str, names=None) -> bool:
        """Some head of ``task`` (of ``names``, when given) starts from the encoder's own layers
        (ladder ``init: encoder``): its job reads the checkpoint's weights as well as the states."""
        heads = self.task_heads(task)
        return any(heads[n].get("init") == "encoder" for n in (heads if names is None else names) if n in heads)

    def search_heads(self, task: str) -> list[str]:
        return list(self.task_overrides(task).get("search_heads") or [])

    def data_fraction_tasks(self) -> list[str]:
        return list(self.config["experiments"]["data_fraction"]["tasks"])

    def data_fraction_heads(self, task: str) -> dict[str, dict]:
        heads = self.task_heads(task)
        names = self.config["experiments"]["data_fraction"]["heads"]
        names = list(heads) if names is None else names
        return {n: heads[n] for n in names}

    def finished_heads(self, run: Run) -> list[str]:
        """The heads of ``run``'s head job that its race must not stop, for an experiment reads
        their runs: the shared heads a shared encoder reads there (``SharedEncoderSettings``), and
        the data-fraction heads at the experiment's checkpoints (the whole-data point of a curve
        whose shares train to their end)."""
        names = set(super().finished_heads(run))
        if run.task in self.data_fraction_tasks() and run.checkpoint in self.data_fraction_checkpoints():
            names |= set(self.data_fraction_heads(run.task))
        return sorted(names)

    def data_fraction_checkpoints(self) -> list[Checkpoint]:
        wanted = self.config["experiments"]["data_fraction"]["checkpoints"]
        return self.checkpoints if wanted is None else [Checkpoint(f) for f in sorted(wanted)]

    def data_fractions(self) -> list[str]:
        return [fraction_name(f) for f in sorted(self.config["experiments"]["data_fraction"]["fractions"])]

    def transfer_tasks(self) -> list[str]:
        return list(self.config["experiments"]["transfer"]["tasks"])

    def head_work(self, names) -> float:
        """Head trainings of the heads ``names`` (heads.models keys), each weighted by its type's
        training cost relative to an adapter of width 64 (what the runtime requests assume)."""
        models = self.config["heads"]["models"]
        return sum(get_head_type(models[n]["type"]).relative_cost for n in names)

    # --- typed settings per stage ----------------------------------------------------------
    def layered(self, block: str, task: str | None = None, *more: dict) -> dict:
        """A settings block (``finetune.settings``, ``heads.training``): the schema's defaults, the
        config's block, ``task``'s own changes (``tasks.<task>.finetune`` / ``head_training``),
        then ``more``; each layer's keys win over the ones before."""
        section, name = block.split(".")
        layers = [self.config[section][name]]
        if task is not None:
            layers.append(self.task_overrides(task).get(TASK_LAYERS[block], {}))
        merged = schema_default(block)
        for layer in [*layers, *more]:
            merged.update(layer)
        return merged

    def download(self, task: str) -> DownloadSettings:
        """``task``'s download settings, null where the task does not read one: a task of the
        config's own reads no data.source (nor its folders and hub_repo), a GLUE task not
        data.squad_dir, a question task not data.glue_dir, and an article_split's shares replace
        data.selection_fraction."""
        spec, over, data = get_task(task), self.task_overrides(task), self.config["data"]
        source = None if spec.declared else data["source"]
        read = {
            "source": source,
            "glue_dir": data["glue_dir"] if source == "local" and not spec.squad else None,
            "squad_dir": data["squad_dir"] if source == "local" and spec.squad else None,
            "hub_repo": data["hub_repo"] if source == "hub" else None,
            "selection_fraction": None if over.get("article_split") else data["selection_fraction"],
        }
        sizes = {k: over.get(k) for k in ("train_size", "selection_size", "eval_size", "article_split")}
        return DownloadSettings.pick({**data, **read, **sizes}, self.source)

    def tokenize(self, model: str, task: str) -> TokenizeSettings:
        spec = get_task(task)
        stride = (self.task_overrides(task).get("doc_stride") or spec.doc_stride) if spec.windowed else None
        return TokenizeSettings(
            backbone=self.pretrained(model),
            max_length=self.max_length(task),
            doc_stride=stride,
        )

    def finetune(self, model: str, task: str, checkpoint: Checkpoint | None = None) -> FinetuneSettings:
        """Fine-tuning's settings (at ``checkpoint`` 0, the untouched encoder, only its backbone)."""
        if checkpoint is not None and checkpoint.fraction == 0:
            return FinetuneSettings(backbone=self.pretrained(model), optimizer=None, schedule_epochs=None)
        section = self.layered("finetune.settings", task)
        schedule = section["schedule_epochs"] or max(max(c.fraction for c in self.checkpoints), 1e-9)
        return FinetuneSettings.pick(section, self.source, backbone=self.pretrained(model), schedule_epochs=schedule)

    def bert_scoring(self, task: str) -> BertScoringSettings:
        return BertScoringSettings.pick(self.layered("finetune.settings", task), self.source)

    def finetune_compute(self, checkpoint: Checkpoint | None = None) -> FinetuneCompute:
        """``finetune.device`` and ``.precision``; at ``checkpoint`` 0, which only initialises the
        task model, ``NO_DEVICE``: a change to those keys reruns no job of the untouched encoder."""
        if checkpoint is not None and checkpoint.fraction == 0:
            return NO_DEVICE
        return FinetuneCompute.pick(self.config["finetune"], self.source)

    def extract(self) -> ExtractSettings:
        return ExtractSettings.pick(self.config["extract"], self.source)

    def extract_compute(self) -> ExtractCompute:
        return ExtractCompute.pick(self.config["extract"], self.source)

    def head_training(self, task: str) -> HeadTrainingSettings:
        """``task``'s head training settings before any head's own: what a job that applies
        trained heads (transfer, head_transfer) holds in memory."""
        return HeadTrainingSettings.pick(self.layered("heads.training", task), self.source)

    def head_settings(self, task: str, names=None) -> dict[str, HeadSettings]:
        """The heads ``names`` (default: every head of ``task``) as ``task``'s jobs train them:
        each one's architecture, and its final training settings, merged here and only here:
        the schema's defaults, heads.training, ``tasks.<task>.head_training``, then the head's
        own ``training``. (A searched head's best parameters go on top in its job, where the
        study's result exists: ``stages.train_heads``.)"""
        heads = self.task_heads(task)
        return {
            name: HeadSettings(
                spec={k: v for k, v in heads[name].items() if k != "training"},
                training=HeadTrainingSettings.pick(
                    self.layered("heads.training", task, heads[name].get("training") or {}), self.source
                ),
            )
            for name in (heads if names is None else names)
        }

    def head_job_terms(self, task: str, trainings: dict[str, float] | None = None) -> dict:
        """What sizes a head job of ``task`` (``plan.estimates.heads_request``'s keyword
        arguments), from the final settings of its heads; ``trainings``: head name -> how often
        the job trains it (its seeds, or a search worker's trials). The job's epochs are its
        longest head's ``max_epochs`` (streamed heads train in lockstep); ``n_runs`` weights each
        training by its type's cost and its share of those epochs; ``reads_encoder``: a head starts
        from the encoder's own layers, which the job holds. None: a job that applies trained
        heads, sized as one training with the task's settings."""
        if trainings is None:
            own = self.head_training(task)
            keys = ("max_epochs", "batch_size", "in_memory_max_mb")
            return {"n_runs": 1, **{k: getattr(own, k) for k in keys}}
        heads = self.head_settings(task, trainings)
        epochs = max(head.training.max_epochs for head in heads.values())
        return {
            "n_runs": sum(
                n * self.head_work([name]) * heads[name].training.max_epochs / epochs for name, n in trainings.items()
            ),
            "max_epochs": epochs,
            "batch_size": max(head.training.batch_size for head in heads.values()),
            "in_memory_max_mb": HeadSettings.memory_mb(heads.values()),
            "reads_encoder": self.heads_read_encoder(task, trainings),
        }

    def head_runtime(self, gpus: int = 0) -> HeadRuntimeSettings:
        """Where a head job trains: ``heads.device``, but a job given GPUs (``gpus``, its
        request) uses them, whatever ``heads.device`` says."""
        runtime = HeadRuntimeSettings.pick(self.config["heads"], self.source)
        return runtime.replace(device="auto") if gpus and runtime.device == "cpu" else runtime

    def head_race(self) -> HeadRaceSettings:
        return HeadRaceSettings.pick(self.config["heads"]["race"], self.source)

    def checkpoint_race(self) -> RaceSettings:
        return RaceSettings.pick(self.config["heads"]["race"], self.source)

    def search(self) -> SearchSettings:
        return SearchSettings.pick(self.config["search"], self.source, head_seed=self.head_seeds[0])

    def extract_attrs(self, run: Run, checkpoint_name: str | None = None, heads: dict | None = None) -> dict:
        """What each feature shard records about where it came from (``checkpoint_name``: a
        shared encoder's, for its states; ``heads``: the heads that read them, default the task's)."""
        return {
            "model": run.model,
            "task": run.task,
            "checkpoint": checkpoint_name or run.checkpoint.name,
            "ft_seed": int(run.ftseed),
            "label_kind": get_task(run.task).kind,
            # only when every token is stored for an example task, so [CLS] extractions keep their params
            **({"features": "tokens"} if self.token_features(run.task) else {}),
            # likewise, only when a pair's texts are encoded alone
            **({"pair_forms": list(forms)} if (forms := self.pair_forms(run.task, heads)) != ("joint",) else {}),
        }

    def shared_extract_attrs(self, model: str, encoder: str, ftseed: int, task: str) -> dict:
        """The shard attributes of ``task``'s states of a shared encoder."""
        enc = self.shared_encoders()[encoder]
        run = Run(model, task, ftseed, enc.checkpoint)
        return {**self.extract_attrs(run, enc.checkpoint_name, self.shared_heads(task)), "encoder": encoder}
