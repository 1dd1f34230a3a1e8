"""The ``predict`` stage: a task's unlabelled file (``tasks.<name>.files.test``) answered by the
path the summary picked, through the same engine that serves it (``serving.engine``), so the file
holds exactly what ``bertvision serve`` would answer for each row (its request limits aside: a text
longer than ``serve.max_text_chars`` is answered here, cut to ``max_length`` tokens as every text
is). Never scored.

The output is the input file's rows in its order with every column it has, as written (ids kept
beside their rows; a header with no row yet gives a header with no row), the label column (the
user's name for it; added where the file has none) holding the predicted label (classification)
or score (regression), and, for classification, one ``probability_<label>`` column per label."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from bertvision.data.task_files import read_unlabelled
from bertvision.errors import MissingError
from bertvision.files import atomic_path
from bertvision.registry.task_spec import TaskSpec
from bertvision.serving.bundle import Bundle, bundle_paths, load_bundle
from bertvision.serving.engine import Engine
from bertvision.serving.items import ExampleResult, TextItem

log = logging.getLogger(__name__)

ROWS_PER_PASS = 64


def bundle_of(task: str, bundles: Path) -> Bundle:
    """The bundle of a set (``serve-bundles``' output) or the single bundle that serves ``task``."""
    for path in bundle_paths([bundles]):
        bundle = load_bundle(path)
        if task in bundle.tasks:
            return bundle
    raise MissingError(f"{bundles}: no bundle serves task {task}")


def prediction_columns(task: TaskSpec, results: list[ExampleResult]) -> dict[str, list]:
    if task.kind == "regression":
        values = [[r.score for r in results]]
    else:
        values = [[r.label for r in results], *([r.probabilities[name] for r in results] for name in task.label_names)]
    return dict(zip(task.prediction_columns, values, strict=True))


def csv_cell(value):
    """A cell of the file as read, as its CSV cell: a JSON object, list or bool as JSON text (not
    Python's repr), a Parquet list likewise."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict | list | bool):
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


def predict_unlabelled(task: TaskSpec, bundles: Path, out: Path, threads: int | None = None) -> None:
    """Write ``out`` (CSV): every row of the task's unlabelled file with the picked path's answer."""
    if not task.unlabelled_file:
        where = (
            f"tasks.{task.name}.files.test"
            if task.declared
            else "a registered task's rows are all labelled; a task of your own names one as files.test"
        )
        raise MissingError(f"task {task.name} has no unlabelled file ({where})")
    bundle = bundle_of(task.name, bundles)  # before the rows: a bundle without the task is the first thing to say
    given, rows = read_unlabelled(task)
    engine = Engine(bundle, threads=threads)
    picked = engine.tasks[task.name].picked
    log.info("%s: %d rows of %s, head %s of bundle %s", task.name, len(rows), task.unlabelled_file, picked,
             engine.bundle.root)  # fmt: skip
    texts = [tuple(str(row[field]) for field in task.text_fields) for _, row in rows.iterrows()]
    results: list[ExampleResult] = []
    for start in range(0, len(texts), ROWS_PER_PASS):
        items = [TextItem(t, {task.name: picked}) for t in texts[start : start + ROWS_PER_PASS]]
        results += [answers[task.name] for answers in engine.predict(items)[0]]
    frame = given.iloc[rows["idx"].to_numpy()].reset_index(drop=True)  # every column of the file: ids by their rows
    for column in frame.select_dtypes(include=object).columns:
        frame[column] = frame[column].map(csv_cell)
    for column, values in prediction_columns(task, results).items():
        frame[column] = values
    with atomic_path(Path(out)) as tmp:
        frame.to_csv(tmp, index=False)
    log.info("wrote %s (%d rows; %s encoder passes)", out, len(frame), engine.encoder_passes)
    print(f"{task.name}: {len(frame)} rows predicted by {picked}: {out}")
