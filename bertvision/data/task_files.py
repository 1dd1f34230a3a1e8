"""A user's own labelled files as the canonical frame of one split of a task: the columns, texts
and labels each row must hold (the file itself is read by ``data.table_files``). An error is one
line naming the file, the row's place in it and the column; no row is ever skipped. ``task_frame``
holds the checks of a split's rows, whatever read them (a file here, a hub dataset in ``data.hub``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.data.table_files import header_place, read_located
from bertvision.data.text import readable
from bertvision.errors import DataFormatError
from bertvision.registry.task_spec import UNLABELLED, TaskSpec

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)  # what a regression label's text may be
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# how spreadsheets and pandas write a missing value: never a class found in train unless the task's labels list it
MISSING_MARKERS = {"na", "n/a", "nan", "null", "#n/a"}
CONSTANT_LABELS_REFUSED = {
    "train": "a regression learns from labels that vary",
    "dev": "Pearson and Spearman correlations are undefined on labels that do not vary",
}


def labels_in(path: Path, label_column: str) -> tuple[str, ...]:
    """The distinct labels of a file's label column as strings: in numeric order when every one is an
    integer, else in lexicographic order (a classification task's label order when none is declared)."""
    path = Path(path)
    frame, where = read_located(path)
    _require_columns(str(path), frame, [label_column], header_place(path))
    _check_label_values(frame[label_column], str(path), where, label_column)
    found = [label_text(value) for value in frame[label_column]]
    empty = next((row for row, text in enumerate(found) if not text), None)
    if empty is not None:
        raise _cell_error(str(path), where(empty), label_column, "missing or empty label")
    marker = next((row for row, text in enumerate(found) if text.lower() in MISSING_MARKERS), None)
    if marker is not None:  # else it would become a class of its own, without a word
        problem = (
            f"label {found[marker]!r} reads as a missing value; fix the row, or list it in the task's labels if it is "
            "a class"
        )
        raise _cell_error(str(path), where(marker), label_column, problem)
    distinct = set(found)
    if all(_INTEGER.fullmatch(text) for text in distinct):
        return tuple(sorted(distinct, key=lambda text: (int(text), text)))
    return tuple(sorted(distinct))


def read_task_file(
    path: Path,
    split: str,
    text_columns: tuple[str, ...],
    text_fields: tuple[str, ...],
    label_column: str | None,
    kind: str,
    labels: tuple[str, ...],
) -> pd.DataFrame:
    """Canonical frame of one split of a file (``task_frame``; ``idx`` is the 0-based row of the file)."""
    return _read_frames(path, split, text_columns, text_fields, label_column, kind, labels)[1]


def read_unlabelled(task: TaskSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The task's unlabelled file (``files.test``), whole: the file as read (every column, ids
    among them, by row) and its canonical frame, what the picked path predicts; its label column,
    if it has one, is not read."""
    layout = task.files
    given, rows = _read_frames(Path(task.unlabelled_file), UNLABELLED, layout.text_columns, task.text_fields, None,
                               task.kind, task.raw_labels)  # fmt: skip
    # the label column is the user's own, documented as overwritten; another would be lost silently
    taken = [c for c in task.prediction_columns if c in given.columns and c != layout.label_column]
    if taken:
        raise DataFormatError(
            f"{task.unlabelled_file}: column {taken[0]!r} is where the predictions go; rename it in the file"
        )
    return given, rows


def _read_frames(
    path, split, text_columns, text_fields, label_column, kind, labels
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A file as read, and its canonical frame (``task_frame``). An unlabelled file may hold no
    row yet (a batch of new rows that is empty today): it is read as none, its header as written."""
    _check_shape(text_columns, text_fields, kind)
    path = Path(path)
    frame, where = read_located(path, rows_needed=split != UNLABELLED)
    if frame.empty and not len(frame.columns):  # JSON of no record: no column to look for
        frame = pd.DataFrame(columns=list(text_columns), dtype=object)
    canonical = task_frame(
        frame, str(path), where, split, text_columns, text_fields, label_column, kind, labels, header_place(path)
    )
    return frame, canonical


def task_frame(
    frame: pd.DataFrame,
    source: str,
    where: Callable[[int], str],
    split: str,
    text_columns: tuple[str, ...],
    text_fields: tuple[str, ...],
    label_column: str | None,
    kind: str,
    labels: tuple[str, ...],
    header: str | None = None,
) -> pd.DataFrame:
    """Canonical frame of one split read from ``source`` (a file, a dataset split): ``idx`` (0-based
    row of ``frame``), one column per text field (``text_fields[i]`` names ``text_columns[i]``) and,
    unless ``label_column`` is None (an unlabelled split), ``label``: an int64 index into ``labels``
    (classification) or a float32 (regression). An error names ``source``, ``where(row)`` and the
    column; a missing column, ``header`` (where the column names are, if anywhere)."""
    _check_shape(text_columns, text_fields, kind)
    _require_columns(source, frame, [*text_columns, *([label_column] if label_column else [])], header)
    out = {"idx": np.arange(len(frame), dtype=np.int64)}
    for column, field in zip(text_columns, text_fields):
        out[field] = _texts(frame[column], source, where, column)
    if label_column is not None:
        raw = frame[label_column]
        if kind == "regression":
            out["label"] = _numbers(raw, source, where, label_column)
            if split in CONSTANT_LABELS_REFUSED and len(np.unique(out["label"])) == 1:
                raise DataFormatError(
                    f"{source}: column {label_column!r}: every {split} label is {out['label'][0]:g}; "
                    f"{CONSTANT_LABELS_REFUSED[split]}"
                )
        else:
            out["label"] = _label_ids(raw, source, where, label_column, split, labels)
    return pd.DataFrame(out)


def repeated_rows(train: pd.DataFrame, rows: pd.DataFrame, text_fields: tuple[str, ...]) -> int:
    """How many of ``rows`` have exactly the texts (every text field) of a row of ``train``."""
    seen = set(train[list(text_fields)].itertuples(index=False, name=None))
    return sum(texts in seen for texts in rows[list(text_fields)].itertuples(index=False, name=None))


def repeats_note(repeated: int, rows: int, split: str) -> str | None:
    """What to say when ``repeated`` of a split's ``rows`` repeat a train row's texts: kept and
    scored as given, but they reward memory. None when none do."""
    if not repeated:
        return None
    return (
        f"{repeated} of {rows} {split} rows repeat a train row's text exactly; a model that remembers train "
        f"scores well on them ({split} is scored as given)"
    )


def repeated_rows_note(train: pd.DataFrame, rows: pd.DataFrame, text_fields: tuple[str, ...], split: str) -> str | None:
    return repeats_note(repeated_rows(train, rows, text_fields), len(rows), split)


def absent_labels_note(train: pd.DataFrame, label_names: tuple[str, ...]) -> str | None:
    """What to say of a classification's labels that no train row has: no model learns them, yet
    each may predict them. None when every label has a row."""
    absent = [name for label, name in enumerate(label_names) if label not in set(train["label"].tolist())]
    if not absent:
        return None
    return f"label(s) {absent} have no train row: no model learns them, though each may predict them"


def _check_shape(text_columns: tuple[str, ...], text_fields: tuple[str, ...], kind: str) -> None:
    if kind not in ("classification", "regression"):
        raise ValueError(f"kind must be classification or regression, not {kind!r}")
    if len(text_fields) != len(text_columns) or len(text_columns) not in (1, 2):
        raise ValueError(f"need 1 or 2 text columns, one field name each: {text_columns} -> {text_fields}")


def _texts(values: pd.Series, source: str, where: Callable[[int], str], column: str) -> pd.arrays.StringArray:
    bad = _first(values, lambda v: isinstance(v, str) and readable(v))
    if bad is not None:
        raise _cell_error(source, where(bad), column, f"empty or non-string text {_shown(values.iloc[bad])}")
    return pd.array(values.to_numpy(dtype=object), dtype="string")


def _numbers(raw: pd.Series, source: str, where: Callable[[int], str], column: str) -> np.ndarray:
    """Regression labels as float32; every one a finite number."""
    numbers = [_number(value) for value in raw]
    bad = _first(numbers, lambda v: v is not None)
    if bad is not None:
        raise _cell_error(source, where(bad), column, f"label {_shown(raw.iloc[bad])} is not a finite number")
    return np.asarray(numbers, dtype=np.float32)


def _label_ids(
    raw: pd.Series, source: str, where: Callable[[int], str], column: str, split: str, labels: tuple[str, ...]
) -> np.ndarray:
    """Classification labels as int64 indices into ``labels``; every one of them in ``labels``."""
    _check_label_values(raw, source, where, column)
    ids = {label_text(label): i for i, label in enumerate(labels)}
    found = [ids.get(label_text(value)) for value in raw]
    bad = _first(found, lambda v: v is not None)
    if bad is not None and not label_text(raw.iloc[bad]):
        raise _cell_error(source, where(bad), column, "missing or empty label")
    if bad is not None:
        allowed = [str(label) for label in labels]
        problem = f"unknown label {_shown(raw.iloc[bad])} in {split}; expected one of {allowed}"
        raise _cell_error(source, where(bad), column, problem)
    return np.asarray(found, dtype=np.int64)


def _require_columns(source: str, frame: pd.DataFrame, wanted: list[str], header: str | None) -> None:
    missing = [column for column in dict.fromkeys(wanted) if column not in frame.columns]
    if missing:
        at = f" {header}:" if header else ""
        raise DataFormatError(f"{source}:{at} missing column(s) {missing}; columns found: {list(frame.columns)}")


def _cell_error(source: str, place: str, column: str, problem: str) -> DataFormatError:
    return DataFormatError(f"{source}: {place}: column {column!r}: {problem}")


def _first(values, ok: Callable[[object], bool]) -> int | None:
    return next((row for row, value in enumerate(values) if not ok(value)), None)


def _check_label_values(raw: pd.Series, source: str, where: Callable[[int], str], column: str) -> None:
    """Every label a string, a number, a bool or missing: a list or an object (JSON) is no label."""
    bad = _first(raw, lambda v: _missing(v) or isinstance(v, str | bool | int | float | Decimal | np.generic))
    if bad is not None:
        problem = f"label {_shown(raw.iloc[bad])} is a {type(raw.iloc[bad]).__name__}; a label is a string or a number"
        raise _cell_error(source, where(bad), column, problem)


def label_text(value) -> str | None:
    """A label's string form, so that one label is one class whatever wrote it: 1 and 1.0 (JSON,
    Parquet, YAML) and "1" and "1.0" (CSV) are "1", 2.5 and "2.50" are "2.5"; an integer's text
    stays as written ("007"), any other text too, in Unicode's composed form (NFC: one spelling of
    "é"); a bool as JSON writes it ("true"); None if missing."""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, str):
        text = unicodedata.normalize("NFC", value.strip())
        if _INTEGER.fullmatch(text) or not _DECIMAL.fullmatch(text) or not math.isfinite(float(text)):
            return text
        value = float(text)  # a number written with a point or an exponent, read as JSON's would be
    if isinstance(value, Decimal):  # Parquet's decimal column: a number, as a float of it reads
        value = float(value)
    if _missing(value):
        return None
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _shown(value) -> str:
    """A cell for a message: null when missing (None, NaN), else the Python repr (3, not np.int64(3))."""
    if _missing(value):
        return "null"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float | np.floating) and math.isnan(value))


def _number(value) -> float | None:
    """A regression label as a finite float32-sized float, or None: a JSON or Parquet number, or a
    text written as a decimal number (not a bool, nor "1_000", "nan" or digits of other scripts,
    which Python's float() would read)."""
    numeric = str | int | float | Decimal | np.integer | np.floating
    if isinstance(value, bool | np.bool_) or not isinstance(value, numeric):
        return None
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) and abs(number) <= _FLOAT32_MAX else None
