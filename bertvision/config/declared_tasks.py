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

The train file is read once here for its row count (job requests) and, without ``labels``, for
its label set; the dev file's labels are checked when the task is downloaded."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from bertvision.data.task_files import labels_in, read_table
from bertvision.errors import BertvisionError, ConfigError
from bertvision.registry.tasks import TASKS, FileLayout, TaskSpec

# a task name is a path part and a Snakemake wildcard (rules/common.smk)
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
DEFAULT_METRICS = {"classification": ("f1_macro", "accuracy"), "regression": ("pearson", "spearman")}
DEFAULT_MAX_LENGTH = 128


def is_declaration(block: dict | None) -> bool:
    return bool(block) and "files" in block


@functools.lru_cache(maxsize=32)
def _train_facts(path: str, mtime_ns: int, label_column: str, labelled_set: bool) -> tuple[int, tuple[str, ...]]:
    rows = len(read_table(Path(path)))
    return rows, (labels_in(Path(path), label_column) if labelled_set else ())


def declared_task(name: str, block: dict) -> TaskSpec:
    """The TaskSpec of ``tasks.<name>`` (a validated block with ``files``); a ConfigError names the key."""
    where = f"tasks.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a task name is lower-case letters, digits and '-' (it names folders)")
    if name in TASKS and not TASKS[name].declared:
        raise ConfigError(f"{where}: {name} is a registered task; give your own task another name")
    text = tuple([block["text"]] if isinstance(block["text"], str) else block["text"])
    kind, train = block["kind"], Path(block["files"]["train"])
    try:
        rows, found = _train_facts(str(train), os.stat(train).st_mtime_ns, block["label"], "labels" not in block)
    except FileNotFoundError:
        raise ConfigError(f"{where}.files.train: {train}: no such file") from None
    except BertvisionError as err:
        raise ConfigError(f"{where}.files.train: {err}") from None
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
