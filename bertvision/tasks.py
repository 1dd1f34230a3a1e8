"""The task registry: everything the pipeline needs to know about a task lives in one entry.

Adding a GLUE-style task means adding one ``TaskSpec`` to ``TASKS``.
Label order follows the Hugging Face ``nyu-mll/glue`` dataset, so the local
``glue_data`` files and the hub give identical label ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class SpanSettings:
    """Question answering: windows over the context and answer decoding."""

    doc_stride: int = 128
    max_answer_length: int = 30
    n_best: int = 20


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # "classification" | "regression" | "span"
    text_fields: tuple[str, ...]  # canonical field names, one or two
    max_length: int
    # The first metric is the one every choice is made on (on the selection split). For MRPC and
    # QQP that is accuracy: F1 of the positive class rewards the constant "all positive" predictor.
    metrics: tuple[str, ...]
    eval_splits: tuple[str, ...]
    hub_id: str
    hub_config: str
    hub_splits: dict[str, str]  # our split name -> hub split name
    glue: GlueFileLayout | None = None
    squad: SquadFileLayout | None = None
    span: SpanSettings | None = None
    # Class names in label-id order; for local files, the raw label strings in the same order.
    label_names: tuple[str, ...] = ()
    raw_labels: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        """Outputs per example (classification, regression) or per token (span: start, end)."""
        return {"regression": 1, "span": 2}.get(self.kind, len(self.label_names))

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2


_GLUE_HUB = "nyu-mll/glue"
_DEV = {"train": "train", "dev": "validation"}


def _glue(name, **kw) -> TaskSpec:
    kw.setdefault("hub_id", _GLUE_HUB)
    kw.setdefault("hub_config", name)
    kw.setdefault("hub_splits", _DEV)
    kw.setdefault("eval_splits", ("dev",))
    return TaskSpec(name=name, **kw)


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in [
        _glue(
            "cola",
            kind="classification",
            text_fields=("sentence",),
            max_length=64,
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
            metrics=("accuracy", "f1"),
            label_names=("not_equivalent", "equivalent"),
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
            metrics=("accuracy", "f1"),
            label_names=("not_duplicate", "duplicate"),
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
        TaskSpec(
            name="squad2",
            kind="span",
            text_fields=("question", "context"),
            max_length=384,
            metrics=("f1", "exact", "HasAns_f1", "HasAns_exact", "NoAns_f1", "NoAns_exact"),
            eval_splits=("dev",),
            hub_id="rajpurkar/squad_v2",
            hub_config="squad_v2",
            hub_splits={"train": "train", "dev": "validation"},
            squad=SquadFileLayout(files={"train": "train-v2.0.json", "dev": "dev-v2.0.json"}),
            span=SpanSettings(doc_stride=128, max_answer_length=30, n_best=20),
        ),
    ]
}


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; the registry has: {', '.join(sorted(TASKS))}") from None


def splits_of(task: TaskSpec) -> tuple[str, ...]:
    """Every split the pipeline materialises for a task: train, the selection split carved
    from train, and the task's evaluation splits."""
    return ("train", "selection", *task.eval_splits)
