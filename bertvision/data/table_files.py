"""A user's file read whole into a frame, with where each row is in it (``line N``, 1-based, in CSV,
TSV and JSON Lines; ``row N``, 0-based like ``idx``, in JSON and Parquet), for error messages.

pandas (pyarrow for Parquet) reads every file. The csv and json modules only check what pandas
would let pass silently (a ragged or blank CSV record, a duplicated header name, a JSON Lines line
that is not an object, a TSV quote that would run over lines) and find the physical line where
each record starts. No row is ever skipped: the file is read whole or refused, in one line naming
it and the place. What the rows must hold for a task is ``data.task_files``'.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from bertvision.errors import DataFormatError, MissingError
from bertvision.files import RepeatedKey, no_such_file, object_once

_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz", ".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_SEPARATOR_HINT = "a .csv file is read as comma-separated and a .tsv file as tab-separated"
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
    return read_located(Path(path))[0]


def read_located(path: Path, rows_needed: bool = True) -> tuple[pd.DataFrame, Callable[[int], str]]:
    """The frame and, for a row index, where that row is in the file ("line N" or "row N");
    ``rows_needed``: a file with a header and no row is refused (else read, as no rows)."""
    fmt = file_format(path)
    if not path.is_file():
        raise MissingError(no_such_file(path))
    if path.stat().st_size == 0 and (rows_needed or fmt != "jsonl"):  # no line: JSON Lines' batch of no rows
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
                header=0,
                names=_header(path, _SEPARATORS[fmt], quoting),  # as written: pandas names a blank one "Unnamed: 0"
            )
        elif fmt == "jsonl":
            lines, records = _scan_jsonl(path)
            frame = pd.DataFrame(records, dtype=object)  # as for JSON: 1 stays 1, None stays None
        elif fmt == "json":
            lines = None
            frame = _read_json(path)
        else:
            lines = None
            frame = pd.read_parquet(path, dtype_backend="numpy_nullable")  # an int column with a null stays int
    except (ValueError, OSError, EOFError) as exc:  # UnicodeDecodeError, a bad gzip or Parquet file
        if isinstance(exc, DataFormatError):
            raise
        if isinstance(exc, UnicodeDecodeError) and (place := _first_undecodable(path)):
            raise DataFormatError(f"{path}: {place}: not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataFormatError(f"{path}: cannot be read as {fmt}: {reason}") from None
    if len(frame) == 0 and rows_needed:
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


def _header(path: Path, sep: str, quoting: int) -> list[str]:
    with _open_text(path, newline="") as fh:
        return next(csv.reader(fh, delimiter=sep, quoting=quoting))


def _scan_separated(path: Path, fmt: str) -> tuple[list[int], int]:
    """``_scan_csv`` of a CSV or TSV file, and the quoting it is read with. CSV has quoting. TSV is
    written both ways: with CSV's quoting (pandas' ``to_csv(sep="\\t")``) and with none, a quote a
    literal character (GLUE's files). Read with quoting, a field of the second kind that opens with
    a quote runs on over the next lines and takes their records into its text; so a TSV is read with
    quoting where that keeps every record on its line, and without where only that reads the file.
    A file that both read, differently (a quoted field holding a tab and a line break, or records
    swallowed by a quote), is refused: either reading could be the wrong one."""
    if fmt == "csv":
        return _scan_csv(path, ",", csv.QUOTE_MINIMAL)[0], csv.QUOTE_MINIMAL
    try:
        quoted, spans_lines = _scan_csv(path, "\t", csv.QUOTE_MINIMAL)
    except DataFormatError as refused:
        quoted, spans_lines = refused, True
    if not spans_lines:
        return quoted, csv.QUOTE_MINIMAL
    try:
        plain = _scan_csv(path, "\t", csv.QUOTE_NONE)[0]
    except DataFormatError:
        if isinstance(quoted, DataFormatError):
            raise quoted from None
        return quoted, csv.QUOTE_MINIMAL
    if isinstance(quoted, DataFormatError):
        return plain, csv.QUOTE_NONE
    line = next(q for q, after in zip(quoted, [*quoted[1:], None]) if after is None or after > q + 1)  # spans
    raise DataFormatError(
        f"{path}: line {line}: read with CSV's quoting (as pandas writes a TSV) a quoted field runs over "
        f"several lines, {len(quoted)} records in all; read without (as GLUE's files are), {len(plain)}: "
        "the file reads both ways; write it as CSV, JSONL or parquet, or as a TSV with no field opening with a quote"
    )


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
                elif len(header) == 1 and not record[0].strip():  # pandas reads it as a blank line
                    raise DataFormatError(f"{path}: line {start}: only spaces, no text")
                elif record == header:
                    raise DataFormatError(f"{path}: line {start}: the header again (files joined with theirs?)")
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
                value = json.loads(line, object_pairs_hook=object_once)
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    f"{path}: line {lineno}: undecodable JSON ({exc.msg}, column {exc.colno})"
                ) from None
            except RepeatedKey as exc:
                raise DataFormatError(f"{path}: line {lineno}: key {exc.args[0]!r} given twice in one object") from None
            if not isinstance(value, dict):
                raise DataFormatError(f"{path}: line {lineno}: expected a JSON object, got {type(value).__name__}")
            _check_unicode(path, f"line {lineno}", value, line)
            lines.append(lineno)
            records.append(value)
    return lines, records


# JSON may escape half of a UTF-16 pair alone (\ud800): json reads it into a str that no tokenizer
# nor file writer takes, so a record is checked where its text holds such an escape
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_unicode(path: Path, place: str, record: dict, text: str | None = None) -> None:
    """A record (read from ``text``, if given, that may hold such an escape) holds no lone surrogate."""
    if text is not None and not _ESCAPED_SURROGATE.search(text):
        return
    for key, value in record.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DataFormatError(
                f"{path}: {place}: column {key!r}: not valid Unicode (a lone surrogate, an escape like \\ud800 "
                "that is half of a pair)"
            ) from None


def read_json_document(path: Path) -> tuple[object, str]:
    """A JSON file's value (each object's keys once) and its text, read as the table files are
    (UTF-8, a byte-order mark allowed, gzip by the suffix); else a DataFormatError naming the file
    and the place."""
    try:
        with _open_text(path) as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        place = _first_undecodable(path) or "a byte"
        raise DataFormatError(f"{path}: {place}: not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
    if not text.strip():
        raise DataFormatError(f"{path}: empty file")
    try:
        return json.loads(text, object_pairs_hook=object_once), text
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: line {exc.lineno}: undecodable JSON ({exc.msg}, column {exc.colno})") from None
    except RepeatedKey as exc:
        raise DataFormatError(f"{path}: key {exc.args[0]!r} given twice in one object") from None


def _read_json(path: Path) -> pd.DataFrame:
    data, text = read_json_document(path)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataFormatError(f'{path}: expected a list of objects or {{"data": [...]}}, got {type(data).__name__}')
    bad = next((row for row, record in enumerate(data) if not isinstance(record, dict)), None)
    if bad is not None:
        raise DataFormatError(f"{path}: row {bad}: expected a JSON object, got {type(data[bad]).__name__}")
    if _ESCAPED_SURROGATE.search(text):
        for row, record in enumerate(data):
            _check_unicode(path, f"row {row}", record)
    return pd.DataFrame(data, dtype=object)  # object: 1 stays 1, not 1.0 beside a null, None stays None


def header_place(path: Path) -> str | None:
    """Where a file's column names are, if it has a header line."""
    return "line 1" if file_format(path) in _SEPARATORS else None
