"""SQuAD 2.0 JSON (the official file layout) into the canonical span-task frame.

One row per question: ``idx``, ``id``, ``title``, ``context``, ``question``,
``answer_texts`` and ``answer_starts`` (lists, possibly empty), ``is_impossible``.
Every question is kept; an answer that does not occur at its ``answer_start`` in the
context is an error naming the file and the question id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.data.table_files import read_json_document
from bertvision.data.text import readable
from bertvision.errors import DataFormatError, MissingError

KINDS = {
    str: "a string",
    int: "an integer",
    list: "a list",
    bool: "true or false",
    (str, int): "a string or an integer",
}
COLUMNS = ["idx", "id", "title", "context", "question", "answer_texts", "answer_starts", "is_impossible"]


def locate(squad_dir: Path, files: dict[str, str], split: str) -> Path:
    base = Path(squad_dir) / files[split]
    for candidate in (base, base.with_name(base.name + ".gz")):
        if candidate.exists():
            return candidate
    raise MissingError(f"SQuAD {split}: neither {base} nor {base}.gz exists (data.squad_dir = {squad_dir})")


def check_questions(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """``df``, every question as training and scoring need it: a question and a context with text,
    each answer a text where its start says, no question id twice; else a DataFormatError naming
    ``source`` (a file, a hub split) and the question."""
    for row in df.itertuples(index=False):
        where = f"{source}: question {row.id}"
        if not readable(row.question) or not readable(row.context):
            raise DataFormatError(f"{where}: empty {'question' if not readable(row.question) else 'context'}")
        for text, start in zip(row.answer_texts, row.answer_starts):
            if not readable(text):  # a span of no token: its start and end would be one token
                raise DataFormatError(f"{where}: answer {text!r} holds no text")
            if row.context[start : start + len(text)] != text:
                raise DataFormatError(f"{where}: answer {text!r} is not at character {start} of its context")
    if df["id"].duplicated().any():
        raise DataFormatError(f"{source}: duplicated question id {df['id'][df['id'].duplicated()].iloc[0]!r}")
    return df


def from_hub_records(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """The hub's squad_v2 rows (answers as {text: [...], answer_start: [...]}) in our columns,
    checked as a file's are (``check_questions``)."""
    out = pd.DataFrame(
        {
            "id": df["id"],
            "title": df["title"],
            "context": df["context"],
            "question": df["question"],
            "answer_texts": [list(a["text"]) for a in df["answers"]],
            "answer_starts": [[int(x) for x in a["answer_start"]] for a in df["answers"]],
        }
    )
    out["is_impossible"] = [len(t) == 0 for t in out["answer_texts"]]
    out.insert(0, "idx", np.arange(len(out), dtype=np.int64))
    return check_questions(out[COLUMNS], source)


def _field(record, key: str, path: Path, where: str, kind: type | tuple[type, ...]):
    """``record[key]``, which must be a ``kind`` (a bool is no integer); else a DataFormatError
    naming the file and the place."""
    if not isinstance(record, dict) or key not in record:
        raise DataFormatError(f"{path}: {where}: no field {key!r} (a SQuAD 2.0 file's layout: data > paragraphs > qas)")
    value = record[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise DataFormatError(f"{path}: {where}: field {key!r} is not {KINDS[kind]}, got {value!r}")
    return value


def parse_squad(path: Path) -> pd.DataFrame:
    try:
        doc = read_json_document(path)[0]
    except (OSError, EOFError) as err:  # a bad gzip file
        raise DataFormatError(f"{path}: cannot be read as SQuAD JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataFormatError(f"{path}: no top-level 'data' list (not a SQuAD file)")
    rows = []
    for a, article in enumerate(doc["data"]):
        title = _field(article, "title", path, f"data[{a}]", str)  # the unit a selection split is carved by
        for p, paragraph in enumerate(_field(article, "paragraphs", path, f"data[{a}]", list)):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", path, where, str)
            for q, qa in enumerate(_field(paragraph, "qas", path, where, list)):
                qid = str(_field(qa, "id", path, f"{where}.qas[{q}]", (str, int)))  # the hub's ids are strings
                question = f"question {qid}"
                answers = _field(qa, "answers", path, question, list) if "answers" in qa else []
                texts = [_field(x, "text", path, question, str) for x in answers]
                starts = [_field(x, "answer_start", path, question, int) for x in answers]
                impossible = _field(qa, "is_impossible", path, question, bool) if "is_impossible" in qa else not texts
                if impossible and texts:
                    raise DataFormatError(f"{path}: {question}: is_impossible but has answers")
                if not impossible and not texts:
                    raise DataFormatError(f"{path}: {question}: answerable but has no answers")
                rows.append(
                    {
                        "id": qid,
                        "title": title,
                        "context": context,
                        "question": _field(qa, "question", path, question, str),
                        "answer_texts": texts,
                        "answer_starts": starts,
                        "is_impossible": impossible,
                    }
                )
    if not rows:
        raise DataFormatError(f"{path}: no questions")
    df = pd.DataFrame(rows)
    df.insert(0, "idx", np.arange(len(df), dtype=np.int64))
    return check_questions(df[COLUMNS], str(path))


def split_by_article(
    df: pd.DataFrame, shares: dict[str, float], seed: int, source: str, key: str
) -> dict[str, pd.DataFrame]:
    """``df``'s questions as ``train`` and the parts ``shares`` names (e.g. selection 0.1, dev
    0.3), by whole articles, so that no context appears in two parts. Articles are shuffled with
    ``seed``; each named part gets ``round(share * n_articles)`` of them (at least one), train the
    rest; too few articles to leave train one is a DataFormatError naming ``source`` and the
    config ``key`` of the shares."""
    titles = df["title"].drop_duplicates().to_numpy()
    held = {name: max(1, int(round(share * len(titles)))) for name, share in shares.items()}
    if sum(held.values()) >= len(titles):
        given = ", ".join(f"{name} {count} ({shares[name]:g} of them)" for name, count in held.items())
        raise DataFormatError(
            f"{source}: {len(titles)} article(s), too few to split by article: {key} gives {given}, "
            "leaving none to train on"
        )
    order = np.random.default_rng(seed).permutation(len(titles))
    parts, start = {}, 0
    for name, count in {"train": len(titles) - sum(held.values()), **held}.items():
        chosen = set(titles[order[start : start + count]])
        parts[name] = df[df["title"].isin(chosen)].reset_index(drop=True)
        start += count
    return parts
