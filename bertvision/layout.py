"""Where every artifact lives: the one owner of paths.

The rules format these templates with their wildcards (``rules/common.smk``); the stages write
and the tables read through the same functions. Records carry their own keys (task, model,
checkpoint, head, seed), so no code ever parses a path back into keys; where a file cannot hold
its keys (Snakemake's benchmark files), its path is built from a record that does
(``bertvision.jobs``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

# The folders of a working directory that hold artifacts (``make clean`` removes them): data/ only
# in part, since a user's own files may lie beside (docs/own-task.md puts them there).
ROOTS = (
    "data/raw",
    "data/tokens",
    "models",
    "baselines",
    "peers",
    "features",
    "heads",
    "heads-data",
    "search",
    "race",
    "transfer",
    "bert_curve",
    "shared",
    "bundles",
    "results",
    "logs",
    "benchmarks",
)
BENCHMARKS_DIR = "benchmarks"  # Snakemake's benchmark file of every job (``benchmark``)

RAW_DIR = "data/raw/{task}"  # {split}.parquet: the canonical rows of each split, and ROWS_RECORD
# Each split's row count and how many of its rows repeat a train row's texts (the summary says so).
ROWS_RECORD = "rows.json"
TOKENS_DIR = "data/tokens/{model}/{task}"  # {split}.parquet: their token ids

FINETUNE_DIR = "models/{model}/{task}/ft{ftseed}"
CHECKPOINT_SUBDIR = "ckpt-{checkpoint}"
CHECKPOINT_DIR = f"{FINETUNE_DIR}/{CHECKPOINT_SUBDIR}"
# What the finetune stage writes into every checkpoint directory: the encoder with its task head,
# its training record (steps, examples, seconds, device; "metrics" null) and what the run's next
# checkpoint goes on from (optimizer, schedule, batch order, clock).
TRAIN_RECORD, RESUME_STATE = "train.json", "resume.pt"
CHECKPOINT_FILES = ("model.safetensors", "config.json", TRAIN_RECORD, RESUME_STATE)
# BERT's own head scored on selection and the evaluation splits (its row in every table; rule
# score_bert), at every checkpoint but 0, whose head has not trained: the training record with
# its metrics, the predictions and the logits (the head + BERT ensembles read them).
BERT_METRICS, BERT_PREDICTIONS, BERT_LOGITS = "eval_metrics.json", "eval_predictions.parquet", "eval_logits.npz"
BERT_SCORE_FILES = (BERT_METRICS, BERT_PREDICTIONS, BERT_LOGITS)
CHECKPOINT_FILE = f"{CHECKPOINT_DIR}/{{file}}"

# The full fine-tuning baseline: one directory per seed, with the kept epoch's evaluation.
BASELINE_DIR = "baselines/{model}/{task}/seed{seed}"
BASELINE_METRICS, BASELINE_PREDICTIONS = "metrics.json", "eval_predictions.parquet"
BASELINE_FILE = f"{BASELINE_DIR}/{{file}}"
BASELINE_FILES = (BASELINE_METRICS, BASELINE_PREDICTIONS)

# A peer method (config ``peers``, ``registry/peers.py``): one directory per method and seed,
# its choice made on selection and its evaluation; the same two files as the baseline's.
PEER_DIR = "peers/{model}/{task}/{peer}/seed{seed}"
PEER_FILE = f"{PEER_DIR}/{{file}}"
PEER_METRICS, PEER_PREDICTIONS = BASELINE_METRICS, BASELINE_PREDICTIONS
PEER_FILES = BASELINE_FILES
# The backbone's own sentence embedding of every text of a task, each distinct text encoded once,
# read by every peer that trains no encoder (the linear model, the cosine).
EMBEDDINGS = "peers/{model}/{task}/embeddings.npz"

FEATURES_DIR = f"features/{{model}}/{{task}}/ft{{ftseed}}/{CHECKPOINT_SUBDIR}"
SHARD_DIR = f"{FEATURES_DIR}/shard-{{shard}}-of-{{n_shards}}"
MANIFEST = f"{FEATURES_DIR}/manifest.json"

HEADS_DIR = f"heads/{{model}}/{{task}}/ft{{ftseed}}/{CHECKPOINT_SUBDIR}"
SUBSET_HEADS_DIR = f"heads-data/{{model}}/{{task}}/ft{{ftseed}}/{CHECKPOINT_SUBDIR}/data-{{train_fraction}}"
HEAD_RUN = "{head}/seed{seed}"  # one trained head, inside a heads directory
HEAD_WEIGHTS, HEAD_METRICS, HEAD_PREDICTIONS = "head.safetensors", "metrics.json", "eval_predictions.parquet"

SEARCH_DIR = f"search/{{model}}/{{task}}/ft{{ftseed}}/{CHECKPOINT_SUBDIR}/{{head}}"
SEARCH_WORKER = f"{SEARCH_DIR}/worker-{{worker}}.json"
SEARCH_BEST = f"{SEARCH_DIR}/best.json"
STUDY_JOURNAL = f"{SEARCH_DIR}/study.journal"

STUDY_LABEL = f"{{model}}/{{task}}/ft{{ftseed}}/{CHECKPOINT_SUBDIR}/{{head}}"  # names a study in its storage

TRANSFER_FILE = "transfer/{model}/{task}/ft{ftseed}.json"

# BERT's own fine-tuning curve (experiments.bert_curve): one record per seed, a score at every point.
BERT_CURVE_FILE = "bert_curve/{model}/{task}/seed{seed}.json"

# The race's decision at a checkpoint (heads.race): whether fine-tuning goes on to the next one.
RACE_DECISION = f"race/{{model}}/{{task}}/{CHECKPOINT_SUBDIR}.json"

# Shared encoders (config section `shared`): one directory per encoder and fine-tuning seed. A
# mixture's encoder is trained here; every encoder's states of each task it serves, and the heads
# trained on them, live under it, unless the main pipeline already has them (a task's own
# checkpoint, the frozen encoder), which are reused in place.
SHARED_DIR = "shared/{model}/{encoder}/ft{ftseed}"
MIXTURE_DIR = f"{SHARED_DIR}/encoder"
MIXTURE_RECORD = "train.json"
MIXTURE_FILES = ("model.safetensors", "config.json", MIXTURE_RECORD)
MIXTURE_FILE = f"{MIXTURE_DIR}/{{file}}"
SHARED_FEATURES_DIR = f"{SHARED_DIR}/features/{{task}}"
SHARED_SHARD_DIR = f"{SHARED_FEATURES_DIR}/shard-{{shard}}-of-{{n_shards}}"
SHARED_MANIFEST = f"{SHARED_FEATURES_DIR}/manifest.json"
SHARED_HEADS_DIR = f"{SHARED_DIR}/heads/{{task}}"
# Heads of a source task applied as they are to a target task with the same label space.
HEAD_TRANSFER_FILE = f"{SHARED_DIR}/head-transfer/{{task}}.json"

# What `bertvision serve` loads: the shared encoder, its tokenizer and every task's heads.
BUNDLE_DIR = "bundles/{model}/{encoder}"
PICKED_BUNDLES_DIR = "bundles/{model}/picked"  # every task's pick (PICKS; serving/picked.py),
BUNDLE_SET_INDEX = "bundles.json"  # their index, which bertvision serve reads as one service
BUNDLE_INDEX = "bundle.json"  # inside a bundle: the index,
BUNDLE_ENCODER = "encoder"  # the encoder and its tokenizer,
BUNDLE_HEAD = "heads/{task}/{head}"  # and each head (weights and metrics record)

# A task's unlabelled file (tasks.<name>.files.test) as the picked path answers it (serving/predictions.py).
PREDICTIONS_FILE = "results/predictions/{model}/{task}.csv"

TABLES_DIR = "results/tables"  # {name}.md and {name}.csv
PICKS = "picks.json"  # beside the tables: every task's pick (reporting/picks.py), which serve_bundles serves
PLOTS_DIR = "results/plots"  # {name}.png

# The wildcards that name one job of each rule, in the order its log and benchmark names use them.
JOB_KEYS = {
    "download": ("task",),
    "tokenize": ("task", "model"),
    "finetune": ("task", "model", "ftseed", "checkpoint"),
    "score_bert": ("task", "model", "ftseed", "checkpoint"),
    "baseline": ("task", "model", "seed"),
    "peer": ("task", "model", "peer", "seed"),
    "embed": ("task", "model"),
    "extract": ("task", "model", "ftseed", "checkpoint", "shard"),
    "feature_manifest": ("task", "model", "ftseed", "checkpoint"),
    "train_heads": ("task", "model", "ftseed", "checkpoint"),
    "train_heads_subset": ("task", "model", "ftseed", "checkpoint", "train_fraction"),
    "search_worker": ("task", "model", "ftseed", "checkpoint", "head", "worker"),
    "search_best": ("task", "model", "ftseed", "checkpoint", "head"),
    "transfer": ("task", "model", "ftseed"),
    "bert_curve": ("task", "model", "seed"),
    "race_checkpoint": ("task", "model", "checkpoint"),
    "finetune_mixture": ("encoder", "model", "ftseed"),
    "extract_shared": ("task", "model", "encoder", "ftseed", "shard"),
    "feature_manifest_shared": ("task", "model", "encoder", "ftseed"),
    "train_heads_shared": ("task", "model", "encoder", "ftseed"),
    "head_transfer": ("task", "model", "encoder", "ftseed"),
    "bundle": ("encoder", "model"),
    "serve_bundles": ("model",),
    "predict": ("task", "model"),
}
_KEY_TEXT = {
    "task": "{task}",
    "model": "{model}",
    "ftseed": "ft{ftseed}",
    "checkpoint": CHECKPOINT_SUBDIR,
    "shard": "{shard}",
    "train_fraction": "data-{train_fraction}",
    "head": "{head}",
    "worker": "{worker}",
    "seed": "seed{seed}",
    "peer": "{peer}",
    "encoder": "enc-{encoder}",
}


def _job_file(root: str, rule: str, ext: str) -> str:
    """``{root}/{rule}/{task}/{the other keys, dash-joined}.{ext}`` (or ``{task}.{ext}``)."""
    first, *rest = JOB_KEYS.get(rule, ())
    name = "-".join(_KEY_TEXT[k] for k in rest) if rest else None
    return f"{root}/{rule}/{_KEY_TEXT[first]}/{name}.{ext}" if name else f"{root}/{rule}/{_KEY_TEXT[first]}.{ext}"


def log(rule: str) -> str:
    """The log file pattern of a rule (a rule with no wildcards logs to ``logs/{rule}.log``)."""
    return _job_file("logs", rule, "log") if rule in JOB_KEYS else f"logs/{rule}.log"


def benchmark(rule: str) -> str:
    """The benchmark file pattern of a rule (a rule with no wildcards: ``benchmarks/{rule}.tsv``)."""
    return _job_file(BENCHMARKS_DIR, rule, "tsv") if rule in JOB_KEYS else f"{BENCHMARKS_DIR}/{rule}.tsv"


def benchmark_files(workdir: Path) -> list[tuple[str, Path]]:
    """Every benchmark file of a working directory with the rule whose jobs it measured (``benchmark``
    names a rule's folder or file after it), in a stable order."""
    root = Path(workdir) / BENCHMARKS_DIR
    return [(path.relative_to(root).parts[0].removesuffix(".tsv"), path) for path in sorted(root.rglob("*.tsv"))]


# Benchmark files named before c55c270 spelled a checkpoint ``ckpt0.3``; today's spell it ``ckpt-0.3``.
_CHECKPOINT_BEFORE_ONE_SPELLING = re.compile(r"(?<=-)ckpt(?=\d)")


def current_benchmark_name(path: Path) -> Path:
    """The benchmark file at ``path`` under today's name: one named before c55c270 (``ckpt0.3``) under
    ``ckpt-0.3`` (``CHECKPOINT_SUBDIR``), the copy scripts/retable.py makes of it; any other, ``path``."""
    today = CHECKPOINT_SUBDIR.format(checkpoint="")
    return Path(path).with_name(_CHECKPOINT_BEFORE_ONE_SPELLING.sub(today, Path(path).name))


def table(name: str, ext: str, tables_dir: str = TABLES_DIR) -> str:
    return f"{tables_dir}/{name}.{ext}"


def picks_record(tables_dir: str = TABLES_DIR) -> str:
    return f"{tables_dir}/{PICKS}"


def plot(name: str, plots_dir: str = PLOTS_DIR) -> str:
    return f"{plots_dir}/{name}.png"


def score_vs_epochs_plot(task: str) -> str:
    """The name of a task's score-vs-epochs plot."""
    return f"{task}-score-vs-epochs"


def split_file(split_dir: Path, split: str) -> Path:
    """One split's rows in a raw or tokens directory."""
    return Path(split_dir) / f"{split}.parquet"


def rows_record(raw_dir: Path) -> Path:
    """A raw directory's record of its splits' rows (``ROWS_RECORD``)."""
    return Path(raw_dir) / ROWS_RECORD


def texts_file(tokens_dir: Path, split: str) -> Path:
    """A pair task's distinct texts of one split, each tokenized alone (for the heads with ``pair: apart``);
    the split's rows name theirs in columns ``text_a`` and ``text_b``."""
    return Path(tokens_dir) / f"{split}-texts.parquet"


def checkpoint_dir(finetune_dir: Path, checkpoint: Checkpoint) -> Path:
    """A checkpoint's directory inside a fine-tuning run's directory."""
    return Path(finetune_dir) / CHECKPOINT_SUBDIR.format(checkpoint=checkpoint)


def shard_file(shard_dir: Path, split: str) -> Path:
    return Path(shard_dir) / f"{split}.h5"


# BERT's own head's logits on a shard's rows of the scored splits, kept by an extraction that ran the
# task model (its states and BERT's outputs from one pass); rule score_bert scores them.
SHARD_BERT_LOGITS = "bert_logits.npz"
# and the seconds that pass spent on each of those splits (BERT's share of the extraction: its whole cost)
SHARD_BERT_PASS = "bert_pass.json"


def bert_record_file(checkpoint: Checkpoint) -> str:
    """The file of a checkpoint's directory that holds BERT's record there: its scores, or at
    checkpoint 0 (not scored) the training record."""
    return BERT_METRICS if checkpoint.fraction > 0 else TRAIN_RECORD


def beside(record_file: Path, name: str) -> str:
    """A run's file ``name`` (its eval predictions), written beside its metrics record."""
    return str(Path(record_file).with_name(name))


def head_run_dir(heads_dir: Path, head: str, seed: int) -> Path:
    return Path(heads_dir) / HEAD_RUN.format(head=head, seed=seed)


def _every_head_metrics() -> str:
    """The glob pattern of every trained head's metrics record, inside a heads directory."""
    return f"{HEAD_RUN.format(head='*', seed='*')}/{HEAD_METRICS}"


def head_metrics_pattern(heads_dir: str) -> str:
    """The glob pattern of every trained head's metrics record in ``heads_dir`` (a path or a pattern)."""
    return f"{heads_dir}/{_every_head_metrics()}"


def head_runs(heads_dir: Path) -> list[Path]:
    """Every trained head (its run directory) in a heads directory, in a stable order."""
    return sorted(p.parent for p in Path(heads_dir).glob(_every_head_metrics()))


def head_metrics_files(heads_dirs: list[Path]) -> list[Path]:
    """The metrics record of every trained head in these heads directories, in a stable order."""
    return sorted(run / HEAD_METRICS for d in heads_dirs for run in head_runs(d))


def fraction_name(fraction: float) -> str:
    """How paths, wildcards and records spell a fraction, of an epoch or of the training rows: 0, 0.3, 1, 2.5;
    every digit it has and no exponent (0.00005), so that two fractions never share a name and every
    name is digits and a point."""
    return format(Decimal(repr(float(fraction))).normalize(), "f")


@dataclass(frozen=True, order=True)
class Checkpoint:
    """A checkpoint of a fine-tuning run: the encoder after ``fraction`` epochs (0: untouched).
    Made once, from the config's number or from the name a wildcard or a record gives, and carried
    as it is; ``name`` is how paths, wildcards and records spell it (0, 0.3, 1, 2.5), and a
    checkpoint formats as its name in a path template."""

    fraction: float

    def __post_init__(self):
        object.__setattr__(self, "fraction", float(self.fraction))

    @classmethod
    def named(cls, name: str) -> Checkpoint:
        """The checkpoint a wildcard, a path's keys or a record's ``checkpoint`` names."""
        return cls(float(name))

    @property
    def name(self) -> str:
        return fraction_name(self.fraction)

    def __str__(self) -> str:
        return self.name


def source_checkpoint(record: dict) -> Checkpoint:
    """The checkpoint whose states a head record or a feature manifest came from."""
    return Checkpoint.named(record["source"]["checkpoint"])


@dataclass(frozen=True)
class Run:
    """One checkpoint of one fine-tuning run: the unit that features and heads belong to."""

    model: str
    task: str
    ftseed: int
    checkpoint: Checkpoint
    stored: bool = True  # False: store: false, the heads' job computes the states (no extract jobs)

    @property
    def keys(self) -> dict:
        """The run's wildcards (its checkpoint formats as its name)."""
        return {"model": self.model, "task": self.task, "ftseed": self.ftseed, "checkpoint": self.checkpoint}

    def to_json(self) -> dict:
        return {**self.keys, "checkpoint": self.checkpoint.name, "stored": self.stored}

    @classmethod
    def from_json(cls, data: dict) -> Run:
        """A run as ``to_json`` (or the rules, as wildcards) wrote it."""
        return cls(
            data["model"],
            data["task"],
            int(data["ftseed"]),
            Checkpoint.named(data["checkpoint"]),
            data.get("stored", True),
        )

    def format(self, pattern: str, **extra) -> str:
        return pattern.format(**self.keys, **extra)

    def served(self) -> dict:
        """The run as ``bertvision serve-bundles`` reads it (``serving.picked.CheckpointRun``): its
        keys, and the folders of its checkpoint and its heads."""
        return {
            "task": self.task,
            "ftseed": self.ftseed,
            "checkpoint": self.checkpoint.name,
            "checkpoint_dir": self.format(CHECKPOINT_DIR),
            "heads_dir": self.format(HEADS_DIR),
        }

    def states_owner(self, first_ftseed: int) -> Run:
        """The run that holds this checkpoint's states and heads. Checkpoint 0 is the untouched
        encoder, the same for every fine-tuning seed, so its extraction, heads and searches are
        one run, under the first fine-tuning seed; every other checkpoint is its own run."""
        if self.checkpoint.fraction == 0:
            return dataclasses.replace(self, ftseed=first_ftseed)
        return self


@dataclass(frozen=True)
class SharedEncoder:
    """One encoder of the ``shared`` section: ``kind`` 'frozen' (the pretrained encoder),
    'task' (``source``'s own fine-tuning run at ``checkpoint``) or 'mixture' (fine-tuned on
    ``tasks`` together). Its artifacts for a task are the main pipeline's where that already
    has them, else under ``SHARED_DIR``."""

    name: str
    kind: str
    source: str | None = None
    checkpoint: Checkpoint | None = None
    tasks: tuple[str, ...] = ()
    first_ftseed: int = 1  # the fine-tuning seed that holds the main pipeline's checkpoint 0 (Run.states_owner)

    @property
    def checkpoint_name(self) -> str:
        """What its states' records name as their checkpoint: a mixture's, its kind."""
        return self.checkpoint.name if self.checkpoint else self.kind

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "checkpoint": self.checkpoint and self.checkpoint.name}

    @classmethod
    def from_json(cls, data: dict) -> SharedEncoder:
        checkpoint = data.get("checkpoint")
        return cls(
            **{
                **data,
                "checkpoint": None if checkpoint is None else Checkpoint.named(checkpoint),
                "tasks": tuple(data.get("tasks") or ()),
            }
        )

    def reuses_main(self, task: str) -> bool:
        """Whether the main pipeline already holds ``task``'s states of this encoder."""
        return self.kind == "frozen" or (self.kind == "task" and task == self.source)

    def keys(self, model: str, ftseed: int, task: str | None = None) -> dict:
        return {"model": model, "encoder": self.name, "ftseed": ftseed, **({"task": task} if task else {})}

    def checkpoint_dir(self, model: str, ftseed: int, any_task: str) -> str:
        """Where the encoder's weights are (the frozen encoder: ``any_task``'s checkpoint 0,
        whose encoder is the pretrained one)."""
        if self.kind == "mixture":
            return MIXTURE_DIR.format(**self.keys(model, ftseed))
        task = self.source if self.kind == "task" else any_task
        return self.main_run(model, ftseed, task).format(CHECKPOINT_DIR)

    def main_run(self, model: str, ftseed: int, task: str) -> Run:
        """The main pipeline's run at this encoder's checkpoint (where ``reuses_main``, the run it reads)."""
        return Run(model, task, ftseed, self.checkpoint).states_owner(self.first_ftseed)

    def manifest(self, model: str, ftseed: int, task: str) -> str:
        if self.reuses_main(task):
            return self.main_run(model, ftseed, task).format(MANIFEST)
        return SHARED_MANIFEST.format(**self.keys(model, ftseed, task))

    def heads_dir(self, model: str, ftseed: int, task: str) -> str:
        if self.reuses_main(task):
            return self.main_run(model, ftseed, task).format(HEADS_DIR)
        return SHARED_HEADS_DIR.format(**self.keys(model, ftseed, task))


def clean(dir: str = ".") -> None:
    """``bertvision clean``: remove every artifact folder (``ROOTS``) of the working directory ``dir``."""
    import shutil

    for root in ROOTS:
        folder = Path(dir) / root
        if folder.exists():
            shutil.rmtree(folder)
            print(f"removed {folder}")
            if folder.parent != Path(dir) and not any(folder.parent.iterdir()):
                folder.parent.rmdir()  # data/, left empty
