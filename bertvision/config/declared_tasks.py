"""A task of the user's own, declared in the config (``tasks.<name>.files``), made into the same
``TaskSpec`` a registered task has, so that every stage treats both alike:

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

The train file is read once here for its row count (job requests) and, without ``labels``, for
its label set; the dev file's labels are checked when the task is downloaded. Question tasks
take SQuAD 2.0's windows, metric, null threshold and defaults (registry.tasks: squad2)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path

from bertvision.data.squad_files import parse_squad
from bertvision.data.task_files import labels_in, read_table
from bertvision.errors import BertvisionError, ConfigError
from bertvision.registry.tasks import TASKS, FileLayout, SquadFileLayout, TaskSpec, get_task

# a task name is a path part and a Snakemake wildcard (rules/common.smk)
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
DEFAULT_METRICS = {"classification": ("f1_macro", "accuracy"), "regression": ("pearson", "spearman")}
DEFAULT_MAX_LENGTH = 128


QUESTION_KINDS = ("span", "answerability")


def is_declaration(block: dict | None) -> bool:
    return bool(block) and "files" in block


@functools.lru_cache(maxsize=32)
def _train_facts(path: str, mtime_ns: int, kind: str, label_column: str | None) -> tuple[int, tuple[str, ...]]:
    """The train file's rows (questions, for a question task) and, given ``label_column``, its labels."""
    if kind in QUESTION_KINDS:
        return len(parse_squad(Path(path))), ()
    return len(read_table(Path(path))), (labels_in(Path(path), label_column) if label_column else ())


def declared_task(name: str, block: dict) -> TaskSpec:
    """The TaskSpec of ``tasks.<name>`` (a validated block with ``files``); a ConfigError names the key."""
    where = f"tasks.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a task name is lower-case letters, digits and '-' (it names folders)")
    if name in TASKS and not TASKS[name].declared:
        raise ConfigError(f"{where}: {name} is a registered task; give your own task another name")
    kind, train = block["kind"], Path(block["files"]["train"])
    missing = [key for key in ("text", "label") if key not in block and kind not in QUESTION_KINDS]
    if missing:
        raise ConfigError(f"{where}: a {kind} task of your own names its {' and '.join(missing)} column(s)")
    wanted_labels = block["label"] if kind == "classification" and "labels" not in block else None
    try:
        rows, found = _train_facts(str(train), os.stat(train).st_mtime_ns, kind, wanted_labels)
    except FileNotFoundError:
        raise ConfigError(f"{where}.files.train: {train}: no such file") from None
    except BertvisionError as err:
        raise ConfigError(f"{where}.files.train: {err}") from None
    if kind in QUESTION_KINDS:
        return question_task(name, block, rows)
    text = tuple([block["text"]] if isinstance(block["text"], str) else block["text"])
    labels = tuple(str(x) for x in block.get("labels") or found) if kind == "classification" else ()
    if kind == "classification" and len(labels) < 2:
        raise ConfigError(f"{where}: a classification task needs at least two labels, found {list(labels)}")
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
            hub_id="",
            hub_config="",
            hub_splits={},
            files=FileLayout(files=dict(block["files"]), text_columns=text, label_column=block["label"]),
            label_names=labels,
            raw_labels=labels,
            label_meanings=meanings,
        )
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def question_task(name: str, block: dict, rows: int) -> TaskSpec:
    """A span or answerability task over the config's own SQuAD 2.0 files: SQuAD 2.0's task with
    the files, the question count and what the block sets."""
    like = get_task("squad2" if block["kind"] == "span" else "squad2-answerable")
    files = dict(block["files"])
    return dataclasses.replace(
        like,
        name=name,
        max_length=block.get("max_length") or like.max_length,
        train_rows=rows,
        metrics=tuple(block.get("metrics") or like.metrics),
        hub_id="",
        hub_config="",
        hub_splits={},
        squad=SquadFileLayout(files=files),
        files=FileLayout(files=files, text_columns=like.text_fields, label_column="answers"),
    )
