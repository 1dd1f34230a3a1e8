"""What the pipeline knows about a task: its ``TaskSpec`` (kind, text fields, metrics, splits) and
where its rows come from (GLUE files, SQuAD files, the config's own files or hub dataset). The
registered tasks (``registry.tasks``) and the config's own (``config.declared_tasks``) are both
TaskSpecs; nothing downstream tells them apart."""

from __future__ import annotations

import dataclasses
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

    @property
    def two_texts(self) -> bool:
        """Whether an example is a pair of texts (not a question's window): a head may read it apart."""
        return self.is_pair and not self.windowed

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

    @property
    def prediction_columns(self) -> tuple[str, ...]:
        """What predicting the unlabelled file adds to its columns: the label column, and a
        classification's probability of each label (``probability_<label>``)."""
        classes = self.label_names if self.kind == "classification" else ()
        return (self.files.label_column, *(f"probability_{name}" for name in classes))

    def labelled(self) -> TaskSpec:
        """This task less its unlabelled file: what its labelled splits follow from."""
        if not self.unlabelled_file:
            return self
        files = {split: path for split, path in self.files.files.items() if split != UNLABELLED}
        return dataclasses.replace(self, files=dataclasses.replace(self.files, files=files))

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


def splits_of(task: TaskSpec) -> tuple[str, ...]:
    """Every split the pipeline materialises for a task: train, the selection split carved
    from train, and the task's evaluation splits."""
    return ("train", "selection", *task.eval_splits)


def scored_splits(task: TaskSpec) -> tuple[str, ...]:
    """The splits a model is scored on: selection (what choices are made on) and the evaluation
    splits (what is reported)."""
    return ("selection", *task.eval_splits)
