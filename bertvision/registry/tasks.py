"""The task registry: every registered task (GLUE, SQuAD 2.0) in one entry, and the tasks the
config declares (``tasks.<name>.files`` / ``hub``), which every job learns from the environment.

Adding a GLUE-style task is one ``register(_glue(...))`` call below (plus its data files): the
config schema, the job requests and the tables all read the registry.
Label order follows the Hugging Face ``nyu-mll/glue`` dataset, so the local
``glue_data`` files and the hub give identical label ids.
"""

from __future__ import annotations

import json
import os

from bertvision.registry.metrics import METRICS, allowed_metrics
from bertvision.registry.task_spec import (
    AnswerabilitySettings,
    GlueFileLayout,
    SpanSettings,
    SquadFileLayout,
    TaskSpec,
)

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
        allowed = allowed_metrics(task.kind, bool(task.answerability))
        problems += [
            f"metric {m!r} aggregates windows: only for answerability tasks"
            if m in METRICS[task.kind]
            else f"metric {m!r} is not a {task.kind} metric ({sorted(METRICS[task.kind])})"
            for m in task.metrics
            if m not in allowed
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
