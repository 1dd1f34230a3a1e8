"""Read a user's own labelled files into the canonical frame of one split of a task.

pandas (pyarrow for Parquet) reads every file. The csv and json modules only check what
pandas would let pass silently (a ragged or blank CSV record, a duplicated header name, a
JSON Lines line that is not an object) and find the physical line where each record starts,
for the error messages. An error is one line naming the file, the place (``line N``, 1-based,
in CSV, TSV and JSON Lines; ``row N``, 0-based like ``idx``, in JSON and Parquet) and the
column. No row is ever skipped: the file is read whole or refused. ``task_frame`` holds the checks
of a split's rows, whatever read them (a file here, a hub dataset in ``data.hub``).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.errors import DataFormatError, MissingError
from bertvision.files import no_such_file

FORMATS = ("csv", "tsv", "jsonl", "json", "parquet")
_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz", ".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_SEPARATOR_HINT = "a .csv file is read as comma-separated and a .tsv file as tab-separated"
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)  # what a regression label's text may be
_FLOAT32_MAX = float(np.finfo(np.float32).max)
CONSTANT_LABELS_REFUSED = {
    "train": "a regression learns from labels that vary",
    "dev": "Pearson and Spearman correlations are undefined on labels that do not vary",
}
# Past the csv module's default of 131,072 characters a cell is refused as malformed; a text that long
# is cut to max_length tokens anyway, so any length a line may have is read.
csv.field_size_limit(2**31 - 1)


def file_format(path: Path) -> str:
    """The format by the file's suffix; each format but Parquet may also be gzip-compressed."""
    name = Path(path).name.lower()
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return suffix.split(".")[1]
    raise DataFormatError(f"{path}: unknown file suffix; expected one of {', '.join(_SUFFIXES)}")


def read_table(path: Path) -> pd.DataFrame:
    """The file as a frame: CSV and TSV cells as strings ("" for an empty cell), JSON values as parsed."""
    return _read(Path(path))[0]


def labels_in(path: Path, label_column: str) -> tuple[str, ...]:
    """The distinct labels of a file's label column as strings: in numeric order when every one is an
    integer, else in lexicographic order (a classification task's label order when none is declared)."""
    path = Path(path)
    frame, where = _read(path)
    _require_columns(str(path), frame, [label_column], _header(path))
    _check_label_values(frame[label_column], str(path), where, label_column)
    found = [_label_text(value) for value in frame[label_column]]
    empty = next((row for row, text in enumerate(found) if not text), None)
    if empty is not None:
        raise _cell_error(str(path), where(empty), label_column, "empty label")
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
    _check_shape(text_columns, text_fields, kind)
    path = Path(path)
    frame, where = _read(path)
    return task_frame(
        frame, str(path), where, split, text_columns, text_fields, label_column, kind, labels, _header(path)
    )


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
    bad = _first(values, lambda v: isinstance(v, str) and bool(v.strip()))
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
    ids = {str(label): i for i, label in enumerate(labels)}
    found = [ids.get(_label_text(value)) for value in raw]
    bad = _first(found, lambda v: v is not None)
    if bad is not None:
        allowed = [str(label) for label in labels]
        problem = f"unknown label {_shown(raw.iloc[bad])} in {split}; expected one of {allowed}"
        raise _cell_error(source, where(bad), column, problem)
    return np.asarray(found, dtype=np.int64)


def _read(path: Path) -> tuple[pd.DataFrame, Callable[[int], str]]:
    """The frame and, for a row index, where that row is in the file ("line N" or "row N")."""
    fmt = file_format(path)
    if not path.is_file():
        raise MissingError(no_such_file(path))
    if path.stat().st_size == 0:
        raise DataFormatError(f"{path}: empty file")
    try:
        if fmt in _SEPARATORS:
            lines, quoting = _scan_separated(path, fmt)
            frame = pd.read_csv(
                path,
                sep=_SEPARATORS[fmt],
                quoting=quoting,
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=True,  # blank lines only end the file here: _scan_csv refuses any before a record
                index_col=False,
                encoding="utf-8-sig",
            )
        elif fmt == "jsonl":
            lines, records = _scan_jsonl(path)
            frame = pd.DataFrame(records, dtype=object)  # as for JSON: 1 stays 1, None stays None
        elif fmt == "json":
            lines = None
            frame = _read_json(path)
        else:
            lines = None
            frame = pd.read_parquet(path)
    except (ValueError, OSError, EOFError) as exc:  # UnicodeDecodeError, a bad gzip or Parquet file
        if isinstance(exc, DataFormatError):
            raise
        if isinstance(exc, UnicodeDecodeError) and (place := _first_undecodable(path)):
            raise DataFormatError(f"{path}: {place}: not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataFormatError(f"{path}: cannot be read as {fmt}: {reason}") from None
    if len(frame) == 0:
        raise DataFormatError(f"{path}: no rows")
    if lines is not None and len(lines) != len(frame):  # cannot happen unless pandas and csv/json disagree
        raise DataFormatError(f"{path}: pandas read {len(frame)} rows but the file holds {len(lines)} records")
    duplicated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if duplicated:
        raise DataFormatError(f"{path}: duplicate column name(s) {duplicated}")
    if lines is None:
        return frame, lambda row: f"row {row}"
    return frame, lambda row: f"line {lines[row]}"


def _open_text(path: Path, newline: str | None = None):
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    return opener(path, "rt", encoding="utf-8-sig", newline=newline)


def _first_undecodable(path: Path) -> str | None:
    """The place (``line N, byte M``) of the first byte in a text file that is not UTF-8 (the decoder's position
    counts from its buffer, not the file)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"line {lineno}, byte {exc.start + 1}"
    return None


def _scan_separated(path: Path, fmt: str) -> tuple[list[int], int]:
    """``_scan_csv`` of a CSV or TSV file, and the quoting it is read with. CSV has quoting. TSV is
    written both ways: with CSV's quoting (pandas' ``to_csv(sep="\\t")``) and with none, a quote a
    literal character (GLUE's files). Read with quoting, a field of the second kind that opens with
    a quote runs on over the next lines and takes their records into its text; so a TSV is read with
    quoting only where that keeps every record on its line, or where it alone reads the file."""
    if fmt == "csv":
        return _scan_csv(path, ",", csv.QUOTE_MINIMAL)[0], csv.QUOTE_MINIMAL
    try:
        quoted, spans_lines = _scan_csv(path, "\t", csv.QUOTE_MINIMAL)
    except DataFormatError as refused:
        quoted, spans_lines = refused, True
    if spans_lines:
        with contextlib.suppress(DataFormatError):
            return _scan_csv(path, "\t", csv.QUOTE_NONE)[0], csv.QUOTE_NONE
    if isinstance(quoted, DataFormatError):
        raise quoted
    return quoted, csv.QUOTE_MINIMAL


def _scan_csv(path: Path, sep: str, quoting: int) -> tuple[list[int], bool]:
    """The line where each data record starts, after checking the header and every record's width
    (pandas would rename a duplicated name to ``x.1``, fill a short record with "" and drop a blank
    line), and whether a record spans lines. Blank lines may end the file (an editor's habit); a
    blank line before a record is refused."""
    spans_lines = False
    starts: list[int] = []
    header: list[str] | None = None
    blank: int | None = None  # the first blank line since the last record
    with _open_text(path, newline="") as fh:
        reader = csv.reader(fh, delimiter=sep, quoting=quoting, strict=True)
        start = 1
        try:
            for record in reader:
                if header is None:
                    header = record
                    _check_header(path, header, sep)
                elif not record:
                    blank = start if blank is None else blank
                elif blank is not None:
                    raise DataFormatError(f"{path}: line {blank}: a blank line, expected {len(header)} fields")
                elif len(record) != len(header):
                    raise DataFormatError(
                        f"{path}: line {start}: {len(record)} field(s), expected {len(header)} fields"
                    )
                else:
                    starts.append(start)
                    spans_lines = spans_lines or reader.line_num > start
                start = reader.line_num + 1
        except csv.Error as exc:
            raise DataFormatError(f"{path}: line {start}: malformed record ({exc})") from None
    if header is None:
        raise DataFormatError(f"{path}: empty file")
    return starts, spans_lines


def _check_header(path: Path, header: list[str], sep: str) -> None:
    """A duplicated column name, or one column whose name holds another separator (the file is
    split on another separator than its suffix says: its records would be refused for their width)."""
    duplicated = sorted(name for name, n in Counter(header).items() if n > 1)
    if duplicated:
        raise DataFormatError(f"{path}: line 1: duplicate column name(s) {duplicated}; header is {header}")
    others = [other for other in (",", "\t", ";", "|") if other != sep and len(header) == 1 and other in header[0]]
    if others:
        raise DataFormatError(
            f"{path}: line 1: one column, {header[0]!r}, whose name holds {others[0]!r}: {_SEPARATOR_HINT}"
        )


def _scan_jsonl(path: Path) -> tuple[list[int], list[dict]]:
    """The line of each record and the record, each checked to be a JSON object with each key once;
    blank lines are no records."""
    lines: list[int] = []
    records: list[dict] = []
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line, object_pairs_hook=_object_once)
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    f"{path}: line {lineno}: undecodable JSON ({exc.msg}, column {exc.colno})"
                ) from None
            except _RepeatedKey as exc:
                raise DataFormatError(f"{path}: line {lineno}: key {exc.args[0]!r} given twice in one object") from None
            if not isinstance(value, dict):
                raise DataFormatError(f"{path}: line {lineno}: expected a JSON object, got {type(value).__name__}")
            lines.append(lineno)
            records.append(value)
    return lines, records


class _RepeatedKey(ValueError):
    """A JSON object that gives a key twice (json keeps the last one silently)."""


def _object_once(pairs: list[tuple[str, object]]) -> dict:
    record = dict(pairs)
    if len(record) != len(pairs):
        raise _RepeatedKey(next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1))
    return record


def _read_json(path: Path) -> pd.DataFrame:
    with _open_text(path) as fh:
        text = fh.read()
    if not text.strip():
        raise DataFormatError(f"{path}: empty file")
    try:
        data = json.loads(text, object_pairs_hook=_object_once)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: line {exc.lineno}: undecodable JSON ({exc.msg}, column {exc.colno})") from None
    except _RepeatedKey as exc:
        raise DataFormatError(f"{path}: key {exc.args[0]!r} given twice in one object") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataFormatError(f'{path}: expected a list of objects or {{"data": [...]}}, got {type(data).__name__}')
    bad = _first(data, lambda record: isinstance(record, dict))
    if bad is not None:
        raise DataFormatError(f"{path}: row {bad}: expected a JSON object, got {type(data[bad]).__name__}")
    return pd.DataFrame(data, dtype=object)  # object: 1 stays 1, not 1.0 beside a null, None stays None


def _header(path: Path) -> str | None:
    """Where a file's column names are, if it has a header line."""
    return "line 1" if file_format(path) in _SEPARATORS else None


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
    bad = _first(raw, lambda v: _missing(v) or isinstance(v, str | bool | int | float | np.generic))
    if bad is not None:
        problem = f"label {_shown(raw.iloc[bad])} is a {type(raw.iloc[bad]).__name__}; a label is a string or a number"
        raise _cell_error(source, where(bad), column, problem)


def _label_text(value) -> str | None:
    """A label's string form, so that 1 and 1.0 (JSON, Parquet) and "1" (CSV) are one label; None if missing."""
    if isinstance(value, str):
        return value.strip()
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
    if isinstance(value, bool | np.bool_) or not isinstance(value, str | int | float | np.integer | np.floating):
        return None
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) and abs(number) <= _FLOAT32_MAX else None
