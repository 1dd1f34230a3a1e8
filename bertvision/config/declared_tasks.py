"""A task of the user's own, declared in the config (``tasks.<name>.files`` or ``.hub``), made
into the same ``TaskSpec`` a registered task has, so that every stage treats both alike:

    tasks:
      reviews:
        files: {train: data/reviews-train.csv, dev: data/reviews-dev.csv}
        text: [title, body]        # one column, or two for a pair task
        label: stars
        kind: classification       # or regression
        labels: [bad, ok, good]    # optional: the full set and its order (else: train's, sorted)
        metrics: [f1_macro, accuracy]   # optional; the first is the one choices are made on
      faq:
        files: {train: data/faq-train.json, dev: data/faq-dev.json}   # SQuAD 2.0 format
        kind: span                 # or answerability: is the question answerable?
      imdb:
        hub: {id: stanfordnlp/imdb, config: plain_text, splits: {train: train, dev: test}, rows: 25000}
        text: text
        label: label
        kind: classification
        labels: [neg, pos]         # required from the hub, as rows (or train_size) is

The train file is read once here for its row count (job requests) and, without ``labels``, for
its label set; every file's rows are checked when the task is downloaded, and by ``check_files``
(``bertvision validate-config``) before anything runs. A hub dataset is
not read here (every job parses the workflow): the block gives its rows and labels, which the
download checks against the dataset (``data.hub``). Question tasks take SQuAD 2.0's windows,
metric, null threshold and defaults (registry.tasks: squad2)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path

from bertvision.data.squad_files import parse_squad
from bertvision.data.table_files import read_table
from bertvision.data.task_files import (
    absent_labels_note,
    label_text,
    labels_in,
    read_task_file,
    read_unlabelled,
    repeated_rows_note,
)
from bertvision.errors import BertvisionError, ConfigError
from bertvision.files import no_such_file
from bertvision.registry.hub_layout import HubLayout
from bertvision.registry.metrics import allowed_metrics
from bertvision.registry.task_spec import UNLABELLED, FileLayout, SquadFileLayout, TaskSpec
from bertvision.registry.tasks import TASKS, get_task

# a task name is a path part and a Snakemake wildcard (rules/common.smk)
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
DEFAULT_METRICS = {"classification": ("f1_macro", "accuracy"), "regression": ("pearson", "spearman")}
DEFAULT_MAX_LENGTH = 128


QUESTION_KINDS = ("span", "answerability")


# the keys that describe a task of one's own; a registered task has its own (a block of it sets none)
OWN_TASK_KEYS = ("kind", "text", "label", "labels", "label_meanings", "metrics")


def is_declaration(block: dict | None) -> bool:
    return bool(block) and ("files" in block or "hub" in block)


@functools.lru_cache(maxsize=32)
def _train_facts(path: str, mtime_ns: int, kind: str, label_column: str | None) -> tuple[int, tuple[str, ...]]:
    """The train file's rows (questions, for a question task) and, given ``label_column``, its labels."""
    if kind in QUESTION_KINDS:
        return len(parse_squad(Path(path))), ()
    return len(read_table(Path(path))), (labels_in(Path(path), label_column) if label_column else ())


def _check_columns(where: str, text, label: str) -> None:
    """No text column is the label column: a model that reads its label would score perfectly."""
    if label in ([text] if isinstance(text, str) else text):
        raise ConfigError(f"{where}.text: column {label!r} is also the label column; the model would read its answer")


def _check_metrics(where: str, kind: str, metrics) -> None:
    """Each named metric is one of its task kind's (a regression scored by accuracy would count
    exact matches of real numbers)."""
    allowed = allowed_metrics("classification" if kind == "answerability" else kind, kind == "answerability")
    wrong = [m for m in metrics if m not in allowed]
    if wrong:
        raise ConfigError(f"{where}.metrics: {', '.join(map(repr, wrong))} not a {kind} metric; one of {allowed}")


# Keys of a task of one's own that only some kinds read (a key no kind reads is the schema's error).
KIND_KEYS = {
    "text": ("classification", "regression"),
    "label": ("classification", "regression"),
    "labels": ("classification",),
    "label_meanings": ("classification",),
}


def declared_task(name: str, block: dict) -> TaskSpec:
    """The TaskSpec of ``tasks.<name>`` (a validated block with ``files`` or ``hub``); a ConfigError names the key."""
    where = f"tasks.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a task name is lower-case letters, digits and '-' (it names folders)")
    if name in TASKS and not TASKS[name].declared:
        raise ConfigError(f"{where}: {name} is a registered task; give your own task another name")
    kind = block["kind"]
    stray = [key for key, kinds in KIND_KEYS.items() if key in block and kind not in kinds]
    if stray:
        kinds = KIND_KEYS[stray[0]]
        raise ConfigError(
            f"{where}.{stray[0]}: {'an' if kind[0] in 'aeiou' else 'a'} {kind} task takes no {stray[0]}; "
            f"only {' and '.join(kinds)} tasks do"
        )
    missing = [key for key in ("text", "label") if key not in block and kind not in QUESTION_KINDS]
    if missing:
        raise ConfigError(f"{where}: a {kind} task of your own names its {' and '.join(missing)} column(s)")
    if kind in QUESTION_KINDS and "test" in block.get("files", {}):
        raise ConfigError(f"{where}.files.test: predictions for an unlabelled file are for classification and "
                          "regression tasks; a question task's files are labelled (train, dev)")  # fmt: skip
    if kind not in QUESTION_KINDS:
        _check_columns(where, block["text"], block["label"])
    _check_metrics(where, kind, block.get("metrics") or ())
    rows, found = _hub_facts(where, block) if "hub" in block else _file_facts(where, block)
    if kind in QUESTION_KINDS:
        return question_task(name, block, rows)
    text = tuple([block["text"]] if isinstance(block["text"], str) else block["text"])
    labels = tuple(label_text(x) for x in block.get("labels") or found) if kind == "classification" else ()
    if kind == "classification" and len(labels) < 2:
        raise ConfigError(f"{where}: a classification task needs at least two labels, found {list(labels)}")
    if len(set(labels)) < len(labels):  # 1 and "1.0": one number, one label
        raise ConfigError(f"{where}.labels: {block['labels']} name one number twice ({list(labels)})")
    meanings = tuple(block.get("label_meanings") or ())
    if meanings and len(meanings) != len(labels):
        raise ConfigError(f"{where}.label_meanings: {len(meanings)} meanings for {len(labels)} labels {list(labels)}")
    try:
        return TaskSpec(
            name=name,
            kind=kind,
            text_fields=("text",) if len(text) == 1 else ("text_a", "text_b"),
            max_length=block.get("max_length") or DEFAULT_MAX_LENGTH,
            train_rows=rows,
            metrics=tuple(block.get("metrics") or DEFAULT_METRICS[kind]),
            eval_splits=("dev",),
            label_names=labels,
            raw_labels=labels,
            label_meanings=meanings,
            **_source_fields(block, text, block["label"]),
        )
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _file_facts(where: str, block: dict) -> tuple[int, tuple[str, ...]]:
    """The train file's rows and, for a classification task without ``labels``, its labels; every
    other file is only looked up (a missing dev or test file would leave a job's input unmade, and
    with its old output present, Snakemake would keep that output without a word)."""
    kind, train = block["kind"], Path(block["files"]["train"])
    wanted_labels = block["label"] if kind == "classification" and "labels" not in block else None
    try:
        facts = _train_facts(str(train), os.stat(train).st_mtime_ns, kind, wanted_labels)
    except FileNotFoundError:
        raise ConfigError(f"{where}.files.train: {no_such_file(train)}") from None
    except BertvisionError as err:  # its message names the file
        raise ConfigError(f"{where}.files.train: {err}") from None
    except (OSError, ValueError) as err:  # a name no file can have: too long, or holding a NUL
        name = str(train).replace("\0", "\\0") if len(str(train)) <= 80 else f"{str(train)[:77]}..."
        raise ConfigError(f"{where}.files.train: {name}: {getattr(err, 'strerror', None) or err}") from None
    for split, path in block["files"].items():
        if not os.path.isfile(path):
            raise ConfigError(f"{where}.files.{split}: {no_such_file(Path(path))}")
    return facts


def _hub_facts(where: str, block: dict) -> tuple[int, tuple[str, ...]]:
    """A hub task's train rows, from the block alone: every job parses the workflow, so the
    dataset is only read when the task is downloaded. Its labels are the block's own."""
    if block["kind"] == "classification" and "labels" not in block:
        raise ConfigError(
            f"{where}.labels: a classification task from the hub lists its labels in id order (a ClassLabel "
            "column's names, as its dataset card gives them): the dataset is not read when the workflow is parsed"
        )
    # with train_size and no rows, the download draws train_size rows: job requests size by it either way
    rows = block["hub"].get("rows") or block.get("train_size")
    if not rows:
        raise ConfigError(
            f"{where}.hub.rows: give the train split's row count (it sizes the job requests), or a train_size: "
            "the dataset is not read when the workflow is parsed"
        )
    return rows, ()


def _source_fields(block: dict, text_columns: tuple[str, ...], label_column: str) -> dict:
    """Where a declared task's rows come from, as TaskSpec fields: its files or its hub dataset."""
    if "hub" not in block:
        layout = FileLayout(files=dict(block["files"]), text_columns=text_columns, label_column=label_column)
        return {"hub_id": "", "hub_config": "", "hub_splits": {}, "files": layout, "hub": None}
    hub = block["hub"]
    return {
        "hub_id": hub["id"],
        "hub_config": hub.get("config") or "",
        "hub_splits": dict(hub["splits"]),
        "files": None,
        "hub": HubLayout(text_columns=text_columns, label_column=label_column, revision=hub.get("revision")),
    }


def check_files(task: TaskSpec) -> list[str]:
    """Read every file of a task declared with ``files`` as its download will, each row and cell
    checked (``bertvision validate-config``: the workflow's parse reads the train file's rows and
    labels only); a ConfigError names the config key, the file, the line and the column. Returns
    notes on what is valid but worth knowing: dev rows whose texts are a train row's, labels
    that no train row has."""
    layout = task.squad or task.files
    files = layout.files if layout else {}
    frames = {}
    for split, path in sorted(files.items(), key=lambda item: ("train", "dev", UNLABELLED).index(item[0])):
        try:
            if task.squad:
                parse_squad(Path(path))
            elif split == UNLABELLED:
                read_unlabelled(task)
            else:
                label = None if split == UNLABELLED else layout.label_column
                frames[split] = read_task_file(Path(path), split, layout.text_columns, task.text_fields, label,
                                               task.kind, task.raw_labels)  # fmt: skip
        except FileNotFoundError:
            raise ConfigError(f"tasks.{task.name}.files.{split}: {no_such_file(path)}") from None
        except BertvisionError as err:
            raise ConfigError(f"tasks.{task.name}.files.{split}: {err}") from None
    if "train" not in frames:
        return []
    notes = {
        f"tasks.{task.name}.files.dev": repeated_rows_note(frames["train"], frames["dev"], task.text_fields, "dev"),
        f"tasks.{task.name}.labels": (
            absent_labels_note(frames["train"], task.label_names) if task.kind == "classification" else None
        ),
    }
    return [f"{key}: {note}" for key, note in notes.items() if note]


def question_task(name: str, block: dict, rows: int) -> TaskSpec:
    """A span or answerability task over the config's own SQuAD 2.0 files or squad_v2-shaped hub
    dataset: SQuAD 2.0's task with the source, the question count and what the block sets."""
    like = get_task("squad2" if block["kind"] == "span" else "squad2-answerable")
    files = dict(block.get("files") or {})  # none from the hub: the layout only says the rows are questions
    return dataclasses.replace(
        like,
        name=name,
        max_length=block.get("max_length") or like.max_length,
        train_rows=rows,
        metrics=tuple(block.get("metrics") or like.metrics),
        squad=SquadFileLayout(files=files),
        **_source_fields(block, like.text_fields, "answers"),
    )
