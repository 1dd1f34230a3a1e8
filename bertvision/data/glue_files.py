"""Parse the classic ``glue_data`` TSV files exactly, row by row.

The files are read as plain tab-separated text with no quoting (quotes are literal
characters in GLUE), so every line becomes exactly one row. A line with the wrong number
of fields, an empty text or an unknown label is an error naming the file and line:
nothing is skipped.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd

from bertvision.data.text import readable
from bertvision.errors import DataFormatError, MissingError
from bertvision.registry.task_spec import TaskSpec


def locate(glue_dir: Path, task: TaskSpec, split: str) -> Path:
    """The file for ``split``, plain or gzip-compressed."""
    name = task.glue.files[split]
    base = Path(glue_dir) / task.glue.folder / name
    for candidate in (base, base.with_name(name + ".gz")):
        if candidate.exists():
            return candidate
    raise MissingError(
        f"{task.name} {split}: neither {base} nor {base}.gz exists "
        f"(data.glue_dir = {glue_dir} must hold the classic glue_data layout)"
    )


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:  # utf-8-sig drops MRPC's BOM
        text = fh.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_split(path: Path, task: TaskSpec, split: str) -> pd.DataFrame:
    """Canonical frame: ``idx`` (0-based row in the file), the task's text fields, ``label``."""
    layout = task.glue
    lines = _read_lines(path)
    if layout.columns is None:
        if not lines:
            raise DataFormatError(f"{path}: empty file, expected a header line")
        header = lines[0].split("\t")
        body_start = 1
    else:
        header = list(layout.columns)
        body_start = 0
    wanted = [*layout.text_columns, layout.label_column]
    missing = [c for c in wanted if c not in header]
    if missing:
        raise DataFormatError(f"{path}: line 1: missing column(s) {missing}; header is {header}")
    text_pos = [header.index(c) for c in layout.text_columns]
    label_pos = header.index(layout.label_column)
    label_ids = {raw: i for i, raw in enumerate(task.raw_labels)}

    texts: list[list[str]] = [[] for _ in text_pos]
    labels: list = []
    for row, line in enumerate(lines[body_start:]):
        lineno = row + body_start + 1
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataFormatError(
                f"{path}: line {lineno}: expected {len(header)} tab-separated fields, got {len(fields)}"
            )
        for out, pos in zip(texts, text_pos):
            value = fields[pos]
            if not readable(value):
                raise DataFormatError(f"{path}: line {lineno}: empty text in column {header[pos]!r}")
            out.append(value)
        raw = fields[label_pos].strip()
        if task.kind == "regression":
            try:
                labels.append(float(raw))
            except ValueError:
                raise DataFormatError(f"{path}: line {lineno}: label {raw!r} is not a number") from None
        else:
            if raw not in label_ids:
                raise DataFormatError(
                    f"{path}: line {lineno}: unknown label {raw!r}; expected one of {list(task.raw_labels)}"
                )
            labels.append(label_ids[raw])

    frame = {"idx": range(len(labels))}
    frame.update({name: col for name, col in zip(task.text_fields, texts)})
    frame["label"] = labels
    return canonical_frame(pd.DataFrame(frame), task)


def canonical_frame(df: pd.DataFrame, task: TaskSpec) -> pd.DataFrame:
    """Fix column order and dtypes of the canonical schema."""
    out = df[["idx", *task.text_fields, "label"]].copy()
    out["idx"] = out["idx"].astype("int64")
    for name in task.text_fields:
        out[name] = out[name].astype("string")
    out["label"] = out["label"].astype("float32" if task.kind == "regression" else "int64")
    return out.reset_index(drop=True)
