"""The task registry: everything the pipeline needs to know about a task lives in one entry.

Adding a GLUE-style task is one ``register(_glue(...))`` call below (plus its data files): the
config schema, the job requests and the tables all read the registry.
Label order follows the Hugging Face ``nyu-mll/glue`` dataset, so the local
``glue_data`` files and the hub give identical label ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from bertvision.registry.hub_layout import HubLayout
from bertvision.registry.metrics import METRICS


@dataclass(frozen=True)
class GlueFileLayout:
    """Where a task lives in the classic ``glue_data`` folder and how its TSV columns read."""

    folder: str
    files: dict[str, str]  # our split name -> file name
    text_columns: tuple[str, ...]
    label_column: str
    # None: the first line is a header. Otherwise the column names of a header-less file.
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SquadFileLayout:
    """SQuAD-format JSON files (plain or .gz) in ``data.squad_dir``."""

    files: dict[str, str]  # our split name -> file name


UNLABELLED = "test"  # a task of the config's own may have an unlabelled split of this name


@dataclass(frozen=True)
class FileLayout:
    """A task declared in the config (``tasks.<name>.files``): a labelled file per split (CSV, TSV,
    JSON Lines, JSON or Parquet, each but Parquet also gzipped), its text columns and label column."""

    files: dict[str, str]  # our split name -> path; "test", if any, is unlabelled: predicted, never scored
    text_columns: tuple[str, ...]
    label_column: str

    @property
    def unlabelled(self) -> str | None:
        """The file the picked path writes predictions for (``files.test``), if the task has one."""
        return self.files.get(UNLABELLED)


@dataclass(frozen=True)
class SpanSettings:
    """Question answering: windows over the context and answer decoding."""

    doc_stride: int
    max_answer_length: int
    n_best: int


@dataclass(frozen=True)
class AnswerabilitySettings:
    """Classification of SQuAD questions from their context windows (windows as in span
    extraction). Each window is one example, labelled by whether it holds no whole answer; a
    question's prediction aggregates its windows' outputs (``registry.metrics.AGGREGATIONS``)."""

    doc_stride: int


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # "classification" | "regression" | "span"
    text_fields: tuple[str, ...]  # canonical field names, one or two
    max_length: int
    # Rows (SQuAD: questions) of the published train split: sizes job requests when the config
    # does not subsample.
    train_rows: int
    # The first metric is the one every choice is made on (on the selection split). For MRPC and
    # QQP that is accuracy: F1 of the positive class rewards the constant "all positive" predictor.
    metrics: tuple[str, ...]
    eval_splits: tuple[str, ...]
    hub_id: str
    hub_config: str
    hub_splits: dict[str, str]  # our split name -> hub split name
    glue: GlueFileLayout | None = None
    squad: SquadFileLayout | None = None
    files: FileLayout | None = None
    hub: HubLayout | None = None  # a task of the config's own from the hub
    span: SpanSettings | None = None
    answerability: AnswerabilitySettings | None = None
    # Class names in label-id order; for local files, the raw label strings in the same order.
    label_names: tuple[str, ...] = ()
    raw_labels: tuple[str, ...] = ()
    # What each label id means across tasks, where the names differ (default: label_names). Two
    # classification tasks with the same meanings share a label space: a head trained on one
    # answers the other as it is (cross-task transfer), its outputs matched by meaning.
    label_meanings: tuple[str, ...] = ()

    @property
    def num_labels(self) -> int:
        """Outputs per example (classification, regression) or per token (span: start, end)."""
        return {"regression": 1, "span": 2}.get(self.kind, len(self.label_names))

    @property
    def doc_stride(self) -> int | None:
        """The window overlap of tasks whose examples are SQuAD context windows; else None."""
        settings = self.span or self.answerability
        return settings.doc_stride if settings else None

    @property
    def windowed(self) -> bool:
        """Whether a row is one window of a question (span and answerability tasks)."""
        return self.doc_stride is not None

    @property
    def meanings(self) -> tuple[str, ...]:
        return self.label_meanings or self.label_names

    def shares_labels_with(self, other: TaskSpec) -> bool:
        return (
            self.kind == other.kind == "classification"
            and len(self.meanings) == len(other.meanings)
            and sorted(self.meanings) == sorted(other.meanings)
        )

    def label_order_from(self, source: TaskSpec) -> list[int]:
        """For each of this task's label ids, the id of ``source``'s label that means the same."""
        return [source.meanings.index(m) for m in self.meanings]

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2

    def primary_score(self, metrics: dict, split: str) -> float:
        """The primary metric on ``split`` from {split: {metric: value}}; NaN where it is missing
        (records from before that split was scored)."""
        return float(metrics.get(split, {}).get(self.primary_metric, float("nan")))

    def headline(self, metrics: dict) -> float:
        """The primary metric on the first evaluation split, from {split: {metric: value}}."""
        return float(metrics[self.eval_splits[0]][self.primary_metric])

    def metric_scale(self) -> float:
        """The best possible score: 1 for GLUE metrics, 100 for SQuAD's."""
        return METRICS[self.kind][self.primary_metric].scale

    @property
    def declared(self) -> bool:
        """A task of the config's own (``tasks.<name>.files`` or ``.hub``), not one of the registry's."""
        return self.files is not None or self.hub is not None

    @property
    def unlabelled_file(self) -> str | None:
        """A task of the config's own with an unlabelled file (``files.test``): the picked path predicts it."""
        return self.files.unlabelled if self.files else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TaskSpec:
        layouts = {"glue": GlueFileLayout, "squad": SquadFileLayout, "files": FileLayout, "hub": HubLayout,
                   "span": SpanSettings, "answerability": AnswerabilitySettings}  # fmt: skip
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        for key, layout in layouts.items():
            if fields.get(key) is not None:
                fields[key] = layout(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields[key].items()})
        return cls(**fields)


_GLUE_HUB = "nyu-mll/glue"
_DEV = {"train": "train", "dev": "validation"}


def _glue(name, **kw) -> TaskSpec:
    kw.setdefault("hub_id", _GLUE_HUB)
    kw.setdefault("hub_config", name)
    kw.setdefault("hub_splits", _DEV)
    kw.setdefault("eval_splits", ("dev",))
    return TaskSpec(name=name, **kw)


def _squad(name, **kw) -> TaskSpec:
    """A task over SQuAD 2.0 questions (official JSON files or the hub's squad_v2)."""
    return TaskSpec(
        name=name,
        text_fields=("question", "context"),
        max_length=384,
        train_rows=130319,
        eval_splits=("dev",),
        hub_id="rajpurkar/squad_v2",
        hub_config="squad_v2",
        hub_splits={"train": "train", "dev": "validation"},
        squad=SquadFileLayout(files={"train": "train-v2.0.json", "dev": "dev-v2.0.json"}),
        **kw,
    )


TASKS: dict[str, TaskSpec] = {}


def register(task: TaskSpec) -> TaskSpec:
    """Add ``task`` to the registry after checking that it is complete and consistent."""
    problems = []
    if task.name in TASKS:
        problems.append("registered twice")
    if task.kind not in METRICS:
        problems.append(f"kind {task.kind!r} is not one of {sorted(METRICS)}")
    else:
        problems += [
            f"metric {m!r} is not a {task.kind} metric ({sorted(METRICS[task.kind])})"
            for m in task.metrics
            if m not in METRICS[task.kind]
        ]
    if not task.metrics:
        problems.append("no metrics")
    if task.kind == "classification" and (len(task.label_names) < 2 or len(task.raw_labels) != len(task.label_names)):
        problems.append("a classification task needs label_names and as many raw_labels")
    if not 1 <= len(task.text_fields) <= 2:
        problems.append("one or two text fields")
    if (task.kind == "span") != (task.span is not None):
        problems.append("span settings exactly for span tasks")
    if task.answerability and (task.kind != "classification" or not task.squad):
        problems.append("answerability settings only for a classification task over SQuAD files")
    problems += [
        f"metric {m!r} aggregates windows: only for answerability tasks"
        for m in task.metrics
        if task.kind in METRICS
        and m in METRICS[task.kind]
        and METRICS[task.kind][m].aggregation
        and not task.answerability
    ]
    if not (task.glue or task.squad or task.files or task.hub):
        problems.append("no source layout (glue, squad, files or hub)")
    expected = task.files.files if task.files else task.hub_splits
    missing = [s for s in ("train", *task.eval_splits) if s not in expected]
    if missing:
        problems.append(f"{'files' if task.files else 'hub_splits'} lacks {missing}")
    if problems:
        raise ValueError(f"task {task.name!r}: " + "; ".join(problems))
    TASKS[task.name] = task
    return task


for _task in [
    _glue(
        "cola",
        kind="classification",
        text_fields=("sentence",),
        max_length=64,
        train_rows=8551,
        metrics=("mcc", "accuracy"),
        label_names=("unacceptable", "acceptable"),
        raw_labels=("0", "1"),
        glue=GlueFileLayout(
            folder="CoLA",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            columns=("source", "label", "original_label", "sentence"),
            text_columns=("sentence",),
            label_column="label",
        ),
    ),
    _glue(
        "sst2",
        kind="classification",
        text_fields=("sentence",),
        max_length=66,
        train_rows=67349,
        metrics=("accuracy",),
        label_names=("negative", "positive"),
        raw_labels=("0", "1"),
        glue=GlueFileLayout(
            folder="SST-2",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("sentence",),
            label_column="label",
        ),
    ),
    _glue(
        "mrpc",
        kind="classification",
        text_fields=("sentence1", "sentence2"),
        max_length=128,
        train_rows=3668,
        metrics=("accuracy", "f1"),
        label_names=("not_equivalent", "equivalent"),
        label_meanings=("not_paraphrase", "paraphrase"),
        raw_labels=("0", "1"),
        glue=GlueFileLayout(
            folder="MRPC",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("#1 String", "#2 String"),
            label_column="Quality",
        ),
    ),
    _glue(
        "stsb",
        kind="regression",
        text_fields=("sentence1", "sentence2"),
        max_length=128,
        train_rows=5749,
        metrics=("pearson", "spearman"),
        glue=GlueFileLayout(
            folder="STS-B",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("sentence1", "sentence2"),
            label_column="score",
        ),
    ),
    _glue(
        "qqp",
        kind="classification",
        text_fields=("question1", "question2"),
        max_length=128,
        train_rows=363846,
        metrics=("accuracy", "f1"),
        label_names=("not_duplicate", "duplicate"),
        label_meanings=("not_paraphrase", "paraphrase"),
        raw_labels=("0", "1"),
        glue=GlueFileLayout(
            folder="QQP",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("question1", "question2"),
            label_column="is_duplicate",
        ),
    ),
    _glue(
        "mnli",
        kind="classification",
        text_fields=("premise", "hypothesis"),
        max_length=128,
        train_rows=392702,
        metrics=("accuracy",),
        label_names=("entailment", "neutral", "contradiction"),
        raw_labels=("entailment", "neutral", "contradiction"),
        eval_splits=("dev_matched", "dev_mismatched"),
        hub_splits={
            "train": "train",
            "dev_matched": "validation_matched",
            "dev_mismatched": "validation_mismatched",
        },
        glue=GlueFileLayout(
            folder="MNLI",
            files={
                "train": "train.tsv",
                "dev_matched": "dev_matched.tsv",
                "dev_mismatched": "dev_mismatched.tsv",
            },
            text_columns=("sentence1", "sentence2"),
            label_column="gold_label",
        ),
    ),
    _glue(
        "qnli",
        kind="classification",
        text_fields=("question", "sentence"),
        max_length=128,
        train_rows=104743,
        metrics=("accuracy",),
        label_names=("entailment", "not_entailment"),
        raw_labels=("entailment", "not_entailment"),
        glue=GlueFileLayout(
            folder="QNLI",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("question", "sentence"),
            label_column="label",
        ),
    ),
    _glue(
        "rte",
        kind="classification",
        text_fields=("sentence1", "sentence2"),
        max_length=256,
        train_rows=2490,
        metrics=("accuracy",),
        label_names=("entailment", "not_entailment"),
        raw_labels=("entailment", "not_entailment"),
        glue=GlueFileLayout(
            folder="RTE",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("sentence1", "sentence2"),
            label_column="label",
        ),
    ),
    _glue(
        "wnli",
        kind="classification",
        text_fields=("sentence1", "sentence2"),
        max_length=128,
        train_rows=635,
        metrics=("accuracy",),
        label_names=("not_entailment", "entailment"),
        raw_labels=("0", "1"),
        glue=GlueFileLayout(
            folder="WNLI",
            files={"train": "train.tsv", "dev": "dev.tsv"},
            text_columns=("sentence1", "sentence2"),
            label_column="label",
        ),
    ),
    _squad(
        "squad2",
        kind="span",
        metrics=("f1", "exact", "HasAns_f1", "HasAns_exact", "NoAns_f1", "NoAns_exact"),
        span=SpanSettings(doc_stride=128, max_answer_length=30, n_best=20),
    ),
    # Gen-1's second task: is the question answerable? One prediction per context window from
    # its [CLS] states; per question, "accuracy"/"f1" aggregate by the most confident window
    # (answerable when any window finds the answer), "*_any_no" by the original's rule (no
    # answer when any window says so). F1 is no-answer's (label 1).
    _squad(
        "squad2-answerable",
        kind="classification",
        metrics=("accuracy", "f1", "accuracy_any_no", "f1_any_no"),
        answerability=AnswerabilitySettings(doc_stride=128),
        label_names=("answerable", "no_answer"),
        raw_labels=("answerable", "no_answer"),
    ),
]:
    register(_task)


# The tasks a config declares (tasks.<name>.files or .hub), as JSON {name: TaskSpec}: the workflow sets it
# (rules/common.smk) and every job it starts reads it, so that a declared task is known by name
# in each job's process as a registered one is.
DECLARED_ENV = "BERTVISION_DECLARED_TASKS"


def declare(task: TaskSpec) -> TaskSpec:
    """Add a config's own task to this process's registry (again: the same declaration is kept)."""
    if TASKS.get(task.name) == task:
        return task
    if task.name in TASKS and not TASKS[task.name].declared:
        raise ValueError(f"task {task.name!r} is a registered task; give a declared task another name")
    TASKS.pop(task.name, None)
    return register(task)


def registered_names() -> list[str]:
    """The registry's own tasks (not those a config declared)."""
    return [name for name, task in TASKS.items() if not task.declared]


def declared_json(tasks: list[TaskSpec]) -> str:
    return json.dumps({t.name: t.to_dict() for t in tasks}, sort_keys=True)


def get_task(name: str) -> TaskSpec:
    if name not in TASKS and os.environ.get(DECLARED_ENV):
        for data in json.loads(os.environ[DECLARED_ENV]).values():
            declare(TaskSpec.from_dict(data))
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; the registry has: {', '.join(sorted(TASKS))}") from None


def splits_of(task: TaskSpec) -> tuple[str, ...]:
    """Every split the pipeline materialises for a task: train, the selection split carved
    from train, and the task's evaluation splits."""
    return ("train", "selection", *task.eval_splits)
