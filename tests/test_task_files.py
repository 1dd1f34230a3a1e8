"""A user's own labelled files: every format read exactly, and each bad input refused in one line
naming the file, the line (or row) and the column."""

import gzip
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertvision.data.table_files import file_format, read_table
from bertvision.data.task_files import labels_in, read_task_file
from bertvision.errors import ConfigError, DataFormatError, MissingError

LABELS = ("bad", "ok", "good")

# Quoted fields holding commas, doubled quotes and newlines; "NA" and "null" are text, not missing.
REVIEWS_CSV = "\n".join(
    [
        "title,body,stars",
        'Fine,"Works, mostly.",ok',
        '"Two\nlines","He said ""no"",\nthen left.",bad',
        "NA,null,good\n",
    ]
)
REVIEWS = [("Fine", "Works, mostly.", 1), ("Two\nlines", 'He said "no",\nthen left.', 0), ("NA", "null", 2)]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def write_gz(path, text):
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path


def read_reviews(path, split="train", labels=LABELS, label="stars"):
    return read_task_file(path, split, ("title", "body"), ("title", "body"), label, "classification", labels)


def refused(call, *args, **kwargs) -> str:
    """The one-line message of the DataFormatError that ``call`` raises."""
    with pytest.raises(DataFormatError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def rows(df):
    return [tuple(r) for r in df.drop(columns="idx").itertuples(index=False)]


# ---- file formats ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("a.csv", "csv"),
        ("a.CSV.gz", "csv"),
        ("a.tsv", "tsv"),
        ("a.tsv.gz", "tsv"),
        ("a.jsonl", "jsonl"),
        ("a.jsonl.gz", "jsonl"),
        ("a.json", "json"),
        ("a.json.gz", "json"),
        ("a.parquet", "parquet"),
    ],
)
def test_format_by_suffix(tmp_path, name, fmt):
    assert file_format(tmp_path / name) == fmt


@pytest.mark.parametrize("name", ["a.xlsx", "a.parquet.gz", "a.txt", "csv"])
def test_unknown_suffix(tmp_path, name):
    path = tmp_path / name
    assert refused(file_format, path) == (
        f"{path}: unknown file suffix; expected one of "
        ".csv, .csv.gz, .tsv, .tsv.gz, .jsonl, .jsonl.gz, .json, .json.gz, .parquet"
    )


# ---- reading every format exactly ---------------------------------------------------------------


def test_csv_quoted_commas_and_newlines_read_exactly(tmp_path):
    df = read_reviews(write(tmp_path / "train.csv", REVIEWS_CSV))
    assert list(df.columns) == ["idx", "title", "body", "label"]
    assert df["idx"].tolist() == [0, 1, 2]
    assert str(df["idx"].dtype) == "int64" and str(df["label"].dtype) == "int64"
    assert str(df["title"].dtype) == "string"
    assert rows(df) == REVIEWS


def test_gzip_csv_is_the_same(tmp_path):
    plain = read_reviews(write(tmp_path / "train.csv", REVIEWS_CSV))
    packed = read_reviews(write_gz(tmp_path / "train.csv.gz", REVIEWS_CSV))
    pd.testing.assert_frame_equal(plain, packed)


def test_read_table_keeps_every_cell_as_text(tmp_path):
    df = read_table(write(tmp_path / "t.csv", "a,b,c\n1,,NA\n007,null,\n"))
    assert df.to_dict("list") == {"a": ["1", "007"], "b": ["", "null"], "c": ["NA", ""]}


def test_tsv_with_csv_quoting(tmp_path):
    text = 'sentence\tlabel\n"tab\there, and a ""quote"""\t1\nplain\t0\n'
    df = read_task_file(
        write(tmp_path / "dev.tsv", text), "dev", ("sentence",), ("sentence",), "label", "classification", ("0", "1")
    )
    assert rows(df) == [('tab\there, and a "quote"', 1), ("plain", 0)]


def test_jsonl_pair_task_numbers_match_label_strings(tmp_path):
    lines = [
        {"premise": "A man sleeps.", "hypothesis": "Someone rests.", "gold": 0},
        {"premise": "A cat.", "hypothesis": "A dog.", "gold": 2},
        {"premise": "Rain.", "hypothesis": "Wet streets.", "gold": "1"},
    ]
    text = "\n".join(json.dumps(line) for line in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n"  # a blank line
    for path in (write(tmp_path / "train.jsonl", text), write_gz(tmp_path / "train.jsonl.gz", text)):
        df = read_task_file(
            path,
            "train",
            ("premise", "hypothesis"),
            ("sentence1", "sentence2"),
            "gold",
            "classification",
            ("0", "1", "2"),
        )
        assert list(df.columns) == ["idx", "sentence1", "sentence2", "label"]
        assert df["idx"].tolist() == [0, 1, 2]
        assert df["label"].tolist() == [0, 2, 1]
        assert df["sentence2"].tolist() == ["Someone rests.", "A dog.", "Wet streets."]


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "data"])
def test_json_list_of_objects(tmp_path, wrap):
    records = [{"text": "yes", "label": "pos"}, {"text": "no", "label": "neg"}]
    path = write(tmp_path / "train.json", json.dumps({"data": records} if wrap else records))
    df = read_task_file(path, "train", ("text",), ("sentence",), "label", "classification", ("neg", "pos"))
    assert rows(df) == [("yes", 1), ("no", 0)]


def test_parquet_regression(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"a": ["x", "y", "z"], "b": ["p", "q", "r"], "score": [0.5, 4, 2.25]}).to_parquet(path)
    df = read_task_file(path, "train", ("a", "b"), ("sentence1", "sentence2"), "score", "regression", ())
    assert str(df["label"].dtype) == "float32"
    assert rows(df) == [("x", "p", 0.5), ("y", "q", 4.0), ("z", "r", 2.25)]


def test_parquet_decimal_labels_are_numbers(tmp_path):
    """A decimal column (a database export's NUMERIC) was refused as "not a finite number", and a
    class label 1.00 was not label 1."""
    import decimal

    import pyarrow as pa

    path = tmp_path / "train.parquet"
    values = [decimal.Decimal("4.59"), decimal.Decimal("1.00"), decimal.Decimal("0.25")]
    pq.write_table(pa.table({"s": ["a", "b", "c"], "y": pa.array(values, pa.decimal128(5, 2))}), path)
    df = read_task_file(path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert df["label"].tolist() == pytest.approx([4.59, 1.0, 0.25])
    df = read_task_file(path, "train", ("s",), ("sentence",), "y", "classification", ("1", "4.59", "0.25"))
    assert df["label"].tolist() == [1, 0, 2]


def test_regression_labels_from_csv_text(tmp_path):
    path = write(tmp_path / "train.csv", "s,y\na,1\nb, -2.5e0 \n")
    df = read_task_file(path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert df["label"].tolist() == [1.0, -2.5]


def test_unlabelled_split_has_no_label(tmp_path):
    path = write(tmp_path / "test.csv", "title,body\nA,B\n")
    df = read_reviews(path, split="test", label=None)
    assert list(df.columns) == ["idx", "title", "body"]


# ---- labels_in -----------------------------------------------------------------------------------


def test_labels_in_numeric_order_when_all_integers(tmp_path):
    path = write(tmp_path / "train.csv", "s,y\na,10\nb,2\nc,1\nd,2\n")
    assert labels_in(path, "y") == ("1", "2", "10")


def test_labels_in_text_order_otherwise(tmp_path):
    path = write(tmp_path / "train.csv", "s,y\na,ok\nb,bad\nc,10\nd,2\n")
    assert labels_in(path, "y") == ("10", "2", "bad", "ok")


def test_labels_in_json_numbers_are_strings(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"s": "a", "y": 3}\n{"s": "b", "y": -1}\n')
    assert labels_in(path, "y") == ("-1", "3")


def test_one_number_is_one_label_whatever_format_wrote_it(tmp_path):
    """A CSV's 1.0, 2.0 and 10.0 were the labels ('1.0', '10.0', '2.0'), in text order, and a JSON
    dev file's 1.0 (the number 1) was then refused; the config's labels: [1.0, ...] likewise."""
    from bertvision.config.declared_tasks import declared_task

    train = write(tmp_path / "train.csv", "s,y\na,1.0\nb,2.0\nc,10.0\nd,2\n")
    dev = write(tmp_path / "dev.jsonl", '{"s": "x", "y": 1.0}\n{"s": "y", "y": 10}\n{"s": "z", "y": "2.00"}\n')
    assert labels_in(train, "y") == ("1", "2", "10")
    read = read_task_file(dev, "dev", ("s",), ("sentence",), "y", "classification", labels_in(train, "y"))
    assert read["label"].tolist() == [0, 2, 1]
    block = {"files": {"train": str(train), "dev": str(dev)}, "text": "s", "label": "y", "kind": "classification"}
    assert declared_task("mine", {**block, "labels": [1.0, 2.0, 10.0]}).raw_labels == ("1", "2", "10")
    assert declared_task("mine", block).raw_labels == ("1", "2", "10")
    with pytest.raises(ConfigError, match=r"^tasks.mine.labels: \[1, '1.0'\] name one number twice \(\['1', '1'\]\)$"):
        declared_task("mine", {**block, "labels": [1, "1.0"]})


def test_labels_in_refuses_an_empty_label_and_a_missing_column(tmp_path):
    path = write(tmp_path / "train.csv", "s,y\na,ok\nb,\n")
    assert refused(labels_in, path, "y") == f"{path}: line 3: column 'y': missing or empty label"
    assert (
        refused(labels_in, path, "stars") == f"{path}: line 1: missing column(s) ['stars']; columns found: ['s', 'y']"
    )


# ---- bad data: one line naming file, line or row, and column -------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(MissingError, match="nope.csv: no such file"):
        read_table(path)


def test_missing_column_lists_the_columns_found(tmp_path):
    path = write(tmp_path / "train.csv", "title,text,stars\nA,B,ok\n")
    assert refused(read_reviews, path) == (
        f"{path}: line 1: missing column(s) ['body']; columns found: ['title', 'text', 'stars']"
    )
    path = write(tmp_path / "train.jsonl", '{"title": "A", "body": "B"}\n')
    assert refused(read_reviews, path) == f"{path}: missing column(s) ['stars']; columns found: ['title', 'body']"


def test_a_file_split_on_another_separator_is_named_so(tmp_path):
    """A spreadsheet's semicolon-separated export saved as .csv is one column: the line says why, before
    any record is refused for its width (a text holding a comma would have been, at its line)."""
    path = write(tmp_path / "train.csv", "title;body;stars\nA;B;ok\nC, with a comma;D;ok\n")
    assert refused(read_reviews, path) == (
        f"{path}: line 1: one column, 'title;body;stars', whose name holds ';': a .csv file is read as "
        "comma-separated and a .tsv file as tab-separated"
    )
    path = write(tmp_path / "tab.csv", "title\tbody\tstars\nA, a comma\tB\tok\n")
    assert "whose name holds '\\t': a .csv file is read as comma-separated" in refused(read_reviews, path)
    path = write(tmp_path / "train.tsv", "title,body,stars\nA,B,ok\n")
    assert "whose name holds ',': a .csv file is read as comma-separated" in refused(read_reviews, path)


def test_tsv_quotes_are_literal_and_take_no_rows(tmp_path):
    """TSV has no quoting, as GLUE's files: a field that opens a quote ends at its tab, so it cannot
    swallow the rows after it (read as CSV, lines 3 to 5 were one text and two labels were lost)."""
    rows = [
        "a\tb\tlabel",
        '"Quoted headline"\tplain\tlow',
        '"Open quote never closed\tA second text.\tmid',
        "Third row first text\tsecond\thigh",
        'She said: "leave now." Then left.\tfine\tlow',
    ]
    path = write(tmp_path / "train.tsv", "\n".join(rows) + "\n")
    frame = read_table(path)
    assert frame["label"].tolist() == ["low", "mid", "high", "low"]
    assert frame["a"].tolist() == ['"Quoted headline"', '"Open quote never closed', "Third row first text",
                                   'She said: "leave now." Then left.']  # fmt: skip


def test_a_tsv_that_reads_both_with_and_without_quoting_is_refused(tmp_path):
    """pandas quotes a text holding a tab and a line break; read without quoting, its halves were two
    rows and a label 'fast' was made up. A quote that swallows rows until one ends just before a tab
    reads both ways too: neither reading can be trusted, and the line says where they part."""
    import pandas as pd

    texts = ["A fine product.", "Specs:\tfast\nShipping: slow", "Broke in a week."]
    pandas_tsv = tmp_path / "pandas.tsv"
    pd.DataFrame({"text": texts, "label": ["pos", "neg", "neg"]}).to_csv(pandas_tsv, sep="\t", index=False)
    glue_like = write(tmp_path / "glue.tsv", '"Open quote\tx\tmid\nnext\ty\thigh\nends here."\tz\tlow\n')
    glue_like.write_text("a\tb\tlabel\n" + glue_like.read_text())
    for path, line, records in ((pandas_tsv, 3, (3, 4)), (glue_like, 2, (1, 3))):
        assert refused(read_table, path) == (
            f"{path}: line {line}: read with CSV's quoting (as pandas writes a TSV) a quoted field runs over several "
            f"lines, {records[0]} records in all; read without (as GLUE's files are), {records[1]}: the file reads "
            "both ways; write it as CSV, JSONL or parquet, or as a TSV with no field opening with a quote"
        )


def test_blank_lines_may_end_a_csv(tmp_path):
    """An editor's trailing blank lines hold no record: every row is read; a blank line before a record is refused."""
    path = write(tmp_path / "train.csv", "title,body,stars\nA,B,ok\nC,D,bad\n\n\n")
    assert read_table(path)["stars"].tolist() == ["ok", "bad"]
    path = write(tmp_path / "gap.csv", "title,body,stars\nA,B,ok\n\n\nC,D,bad\n")
    assert refused(read_table, path) == f"{path}: line 3: a blank line, expected 3 fields"


def test_a_line_of_spaces_in_a_one_column_file_is_refused_by_its_line(tmp_path):
    """pandas reads it as a blank line, the csv module as a record: the two counts disagreed, and the
    message named no line."""
    for text, line in (("sentence\na\n  \nb\n", 3), ("sentence\na\n\t\nb\n", 3), ("sentence\na\nb\n \n", 4)):
        path = write(tmp_path / "test.csv", text)
        assert refused(read_table, path) == f"{path}: line {line}: only spaces, no text"


def test_a_header_repeated_in_the_rows_is_refused_by_its_line(tmp_path):
    """Two files joined by cat: the second's header became a row whose label, "stars", a class."""
    path = write(tmp_path / "train.csv", "title,body,stars\nA,B,ok\ntitle,body,stars\nC,D,bad\n")
    assert refused(read_table, path) == f"{path}: line 3: the header again (files joined with theirs?)"


def test_an_unlabelled_json_lines_file_of_no_bytes_holds_no_row(tmp_path):
    df = read_reviews(write(tmp_path / "test.jsonl", ""), split="test", label=None)
    assert len(df) == 0
    assert refused(read_reviews, write(tmp_path / "train.jsonl", "")) == f"{tmp_path / 'train.jsonl'}: empty file"


def test_a_label_is_one_class_whatever_its_unicode_form_or_json_type(tmp_path):
    """JSON's true and the text "true" were two classes, and "négatif" composed and decomposed two
    (the message for one of them, an unknown label, showed two strings that look the same)."""
    path = write(tmp_path / "train.jsonl", '{"s": "a", "y": true}\n{"s": "b", "y": "true"}\n{"s": "c", "y": false}\n')
    assert labels_in(path, "y") == ("false", "true")
    composed, decomposed = "n\u00e9gatif", "ne\u0301gatif"
    path = write(tmp_path / "train.csv", f"s,y\na,{composed}\nb,{decomposed}\nc,positif\n")
    assert labels_in(path, "y") == (composed, "positif")
    df = read_task_file(path, "train", ("s",), ("sentence",), "y", "classification", (composed, "positif"))
    assert df["label"].tolist() == [0, 0, 1]


def test_duplicate_column_names(tmp_path):
    path = write(tmp_path / "train.csv", "title,body,title,stars\nA,B,C,ok\n")
    assert refused(read_table, path) == (
        f"{path}: line 1: duplicate column name(s) ['title']; header is ['title', 'body', 'title', 'stars']"
    )


@pytest.mark.parametrize("name", ["e.csv", "e.tsv", "e.jsonl", "e.json", "e.parquet"])
def test_empty_file(tmp_path, name):
    path = write(tmp_path / name, "")
    assert refused(read_table, path) == f"{path}: empty file"


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("h.csv", "title,body,stars\n", "no rows"),
        ("h.json", "[]", "no rows"),
        ("h.jsonl", "\n\n", "no rows"),
        ("h.csv.gz", "", "empty file"),
        ("h.json.gz", "", "empty file"),
    ],
)
def test_file_with_no_rows(tmp_path, name, text, problem):
    path = (write_gz if name.endswith(".gz") else write)(tmp_path / name, text)
    assert refused(read_table, path) == f"{path}: {problem}"


@pytest.mark.parametrize("name, text", [("h.csv", "title,body\n"), ("h.json", "[]"), ("h.jsonl", "\n")])
def test_an_unlabelled_file_may_hold_no_row_yet(tmp_path, name, text):
    """A batch of new rows that is empty today is read as none (a train or dev file is refused)."""
    df = read_reviews(write(tmp_path / name, text), split="test", label=None)
    assert list(df.columns) == ["idx", "title", "body"] and len(df) == 0


def test_a_blank_column_name_is_kept_as_written(tmp_path):
    """pandas would name it "Unnamed: 0" (a frame's index written by to_csv): predictions copy the header."""
    path = write(tmp_path / "test.csv", ",title,body\n0,A,B\n1,C,D\n")
    assert read_table(path).columns.tolist() == ["", "title", "body"]


def test_a_parquet_int_column_with_a_null_stays_int(tmp_path):
    """Not 10.0: an id column keeps its form (predictions copy it)."""
    path = tmp_path / "test.parquet"
    pq.write_table(pa.table({"k": pa.array([10, None, 12], pa.int64()), "body": ["a", "b", "c"]}), path)  # no pandas
    assert [str(k) for k in read_table(path)["k"]] == ["10", "<NA>", "12"]


@pytest.mark.parametrize("name", ["train.jsonl", "train.json"])
def test_a_lone_surrogate_escape_is_refused_naming_the_place(tmp_path, name):
    """json reads "\\ud800" into a str no tokenizer or writer takes: refused in one line, any column;
    a whole pair (an emoji written as two escapes) reads."""
    records = ['{"title": "ok \\ud83d\\ude00", "id": "a"}', '{"title": "fine", "id": "x \\udc80"}']
    text = "\n".join(records) if name.endswith("jsonl") else "[" + ",\n".join(records) + "]"
    path = write(tmp_path / name, text)
    place = "line 2" if name.endswith("jsonl") else "row 1"
    assert refused(read_table, path).startswith(f"{path}: {place}: column 'id': not valid Unicode (a lone surrogate")
    write(path, text.replace("\\udc80", ""))
    assert read_table(path)["title"].tolist() == ["ok \U0001f600", "fine"]


def test_crlf_line_endings_count_lines(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes(b'title,body,stars\r\n"a\r\nb",B,ok\r\nC,D,meh\r\n')
    assert refused(read_reviews, path) == (
        f"{path}: line 4: column 'stars': unknown label 'meh' in train; expected one of ['bad', 'ok', 'good']"
    )


def test_undecodable_jsonl_line(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"s": "a", "y": 1}\n\n{"s": "b", "y": }\n')
    assert refused(read_table, path) == f"{path}: line 3: undecodable JSON (Expecting value, column 17)"
    path = write(tmp_path / "list.jsonl", '{"s": "a"}\n["b"]\n')
    assert refused(read_table, path) == f"{path}: line 2: expected a JSON object, got list"


def test_undecodable_json(tmp_path):
    path = write(tmp_path / "train.json", '[\n{"s": "a"},\n{"s": \n]')
    assert refused(read_table, path) == f"{path}: line 4: undecodable JSON (Expecting value, column 1)"
    path = write(tmp_path / "obj.json", '{"rows": []}')
    assert refused(read_table, path) == f'{path}: expected a list of objects or {{"data": [...]}}, got dict'


@pytest.mark.parametrize("body", ['""', "   ", "\t"], ids=["empty", "spaces", "tab"])
def test_empty_text_names_line_and_column(tmp_path, body):
    path = write(tmp_path / "train.csv", f"title,body,stars\nA,B,ok\nC,{body},bad\n")
    cell = "" if body == '""' else body
    assert refused(read_reviews, path) == f"{path}: line 3: column 'body': empty or non-string text {cell!r}"


def test_bad_row_after_an_embedded_newline_names_its_physical_line(tmp_path):
    text = 'title,body,stars\n"multi\nline\ntitle",B,ok\nC,D,good\nE,,bad\n'
    path = write(tmp_path / "train.csv", text)
    assert refused(read_reviews, path) == f"{path}: line 6: column 'body': empty or non-string text ''"
    gz = write_gz(tmp_path / "train.csv.gz", text)
    assert refused(read_reviews, gz) == f"{gz}: line 6: column 'body': empty or non-string text ''"


@pytest.mark.parametrize("value, shown", [(None, "null"), (3, "3"), ("  ", "'  '")])
def test_non_string_json_text_names_the_row(tmp_path, value, shown):
    records = [{"text": "fine", "label": "pos"}, {"text": value, "label": "neg"}]
    path = write(tmp_path / "train.json", json.dumps(records))
    message = refused(
        read_task_file, path, "train", ("text",), ("sentence",), "label", "classification", ("neg", "pos")
    )
    assert message == f"{path}: row 1: column 'text': empty or non-string text {shown}"


def test_null_text_in_parquet_names_the_row(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"text": ["a", "b", None], "label": [1, 0, 1]}).to_parquet(path)
    message = refused(read_task_file, path, "train", ("text",), ("sentence",), "label", "classification", ("0", "1"))
    assert message == f"{path}: row 2: column 'text': empty or non-string text null"


def test_missing_key_in_jsonl_names_the_line(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"text": "a", "label": 1}\n\n{"label": 0}\n')
    message = refused(read_task_file, path, "train", ("text",), ("sentence",), "label", "classification", ("0", "1"))
    assert message == f"{path}: line 3: column 'text': empty or non-string text null"


def test_dev_label_outside_labels(tmp_path):
    path = write(tmp_path / "dev.csv", "title,body,stars\nA,B,ok\nC,D,great\n")
    assert refused(read_reviews, path, split="dev") == (
        f"{path}: line 3: column 'stars': unknown label 'great' in dev; expected one of ['bad', 'ok', 'good']"
    )


def test_a_missing_label_in_any_split_is_refused_by_line(tmp_path):
    """As train's is (``labels_in``): a null or no key in JSON, an empty field in a CSV."""
    path = write(tmp_path / "dev.jsonl", '{"s": "a", "y": 1}\n{"s": "b", "y": null}\n')
    message = refused(read_task_file, path, "dev", ("s",), ("sentence",), "y", "classification", ("0", "1"))
    assert message == f"{path}: line 2: column 'y': missing or empty label"
    path = write(tmp_path / "dev.jsonl", '{"s": "a", "y": 1}\n{"s": "b", "y": 0}\n{"s": "c"}\n')
    message = refused(read_task_file, path, "dev", ("s",), ("sentence",), "y", "classification", ("0", "1"))
    assert message == f"{path}: line 3: column 'y': missing or empty label"
    path = write(tmp_path / "dev.csv", "s,y\na,1\nb, \n")
    message = refused(read_task_file, path, "dev", ("s",), ("sentence",), "y", "classification", ("0", "1"))
    assert message == f"{path}: line 3: column 'y': missing or empty label"


@pytest.mark.parametrize("marker", ["NA", "n/a", "NaN", "null", "#N/A"])
def test_a_missing_value_marker_is_no_class_found_in_train(tmp_path, marker):
    """Without the task's labels, train's labels are the classes: a spreadsheet's NA would be one."""
    path = write(tmp_path / "train.csv", f"s,y\na,pos\nb,neg\nc,{marker}\n")
    assert refused(labels_in, path, "y") == (
        f"{path}: line 4: column 'y': label {marker!r} reads as a missing value; fix the row, or list it in "
        "the task's labels if it is a class"
    )
    # listed among the labels, it is a class like any other
    frame = read_task_file(path, "train", ("s",), ("sentence",), "y", "classification", ("neg", "pos", marker))
    assert frame["label"].tolist() == [1, 0, 2]


@pytest.mark.parametrize("value, shown", [("high", "'high'"), ("", "''"), ("nan", "'nan'"), ("inf", "'inf'")])
def test_regression_label_not_a_number(tmp_path, value, shown):
    path = write(tmp_path / "train.csv", f"s,y\na,1.5\nb,{value}\n")
    message = refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert message == f"{path}: line 3: column 'y': label {shown} is not a finite number"


def test_a_regression_whose_train_labels_never_vary_is_refused(tmp_path):
    path = write(tmp_path / "train.csv", "s,y\na,2\nb,2.0\nc,2\n")
    message = refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert message == f"{path}: column 'y': every train label is 2; a regression learns from labels that vary"
    message = refused(read_task_file, path, "dev", ("s",), ("sentence",), "y", "regression", ())
    assert message == (
        f"{path}: column 'y': every dev label is 2; Pearson and Spearman correlations are undefined on labels "
        "that do not vary"
    )


@pytest.mark.parametrize(
    "cell, shown",
    [("true", "True"), ('"1_000"', "'1_000'"), ('"nan"', "'nan'"), ('"\u0661"', "'\u0661'"), ("1e39", "1e+39")],
    ids=["bool", "underscores", "nan-text", "arabic-digit", "past-float32"],
)
def test_a_json_regression_label_that_python_would_read_as_a_number_is_refused(tmp_path, cell, shown):
    path = write(tmp_path / "train.jsonl", f'{{"s": "a", "y": 1.5}}\n{{"s": "b", "y": {cell}}}\n')
    message = refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert message == f"{path}: line 2: column 'y': label {shown} is not a finite number"


@pytest.mark.parametrize("cell, kind", [('["pos"]', "list"), ('{"name": "neg"}', "dict")])
def test_a_label_that_is_a_json_list_or_object_is_refused(tmp_path, cell, kind):
    path = write(
        tmp_path / "train.jsonl", f'{{"s": "a", "y": "pos"}}\n{{"s": "b", "y": "neg"}}\n{{"s": "c", "y": {cell}}}\n'
    )
    problem = "a label is a string or a number"
    assert problem in refused(labels_in, path, "y") and "line 3: column 'y'" in refused(labels_in, path, "y")
    message = refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "classification", ("neg", "pos"))
    assert message.startswith(f"{path}: line 3: column 'y': label ") and message.endswith(f"is a {kind}; {problem}")


def test_a_json_lines_object_that_gives_a_key_twice_is_refused(tmp_path):
    path = write(tmp_path / "train.jsonl", '{"s": "a", "y": 1.0}\n{"s": "b", "y": 1.0, "y": 9.0}\n')
    assert refused(read_table, path) == f"{path}: line 2: key 'y' given twice in one object"


def test_a_csv_cell_longer_than_the_csv_modules_default_limit_is_read_whole(tmp_path):
    long = "word " * 30_000
    path = write(tmp_path / "train.csv", f'text,label\n"{long}",a\nshort,b\n')
    assert read_table(path)["text"].tolist() == [long, "short"]


def test_regression_nan_in_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"s": ["a", "b"], "y": [1.0, float("nan")]}).to_parquet(path)
    message = refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "regression", ())
    assert message == f"{path}: row 1: column 'y': label null is not a finite number"


def test_ragged_and_blank_csv_records(tmp_path):
    path = write(tmp_path / "short.csv", "title,body,stars\nA,B,ok\nC,bad\n")
    assert refused(read_table, path) == f"{path}: line 3: 2 field(s), expected 3 fields"
    path = write(tmp_path / "long.csv", 'title,body,stars\n"x\ny",B,ok\nC,D,bad,extra\n')
    assert refused(read_table, path) == f"{path}: line 4: 4 field(s), expected 3 fields"
    path = write(tmp_path / "blank.csv", "title,body,stars\nA,B,ok\n\nC,D,bad\n")
    assert refused(read_table, path) == f"{path}: line 3: a blank line, expected 3 fields"


def test_unclosed_quote(tmp_path):
    path = write(tmp_path / "train.csv", 'title,body,stars\nA,B,ok\nC,"never closed,bad\nE,F,ok\n')
    assert refused(read_table, path) == f"{path}: line 3: malformed record (unexpected end of data)"


def test_not_utf8_or_not_parquet(tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes("s,y\ncaf\u00e9,1\n".encode("latin-1"))
    assert (
        refused(read_table, path)
        == f"{path}: line 2, byte 4: not UTF-8 text (invalid continuation byte); save the file as UTF-8"
    )
    # far into a file: the line, not the decoder's position within its buffer
    rows = "".join(f"row {i},{i % 2}\n" for i in range(5000))
    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write("".join(f'{{"s": "row {i}", "y": {i % 2}}}\n' for i in range(5000)).encode() + b'{"s": "\xff"}\n')
    assert refused(read_table, path).startswith(f"{path}: line 5001, byte 8: not UTF-8 text")
    path = tmp_path / "big.tsv"
    path.write_bytes(("s\ty\n" + rows.replace(",", "\t")).encode() + "caf\u00e9\t1\n".encode("latin-1"))
    assert refused(read_table, path).startswith(f"{path}: line 5002, byte 4: not UTF-8 text")
    path = write(tmp_path / "train.parquet", "not parquet")
    assert refused(read_table, path).startswith(f"{path}: cannot be read as parquet: ")


def test_text_after_a_closing_quote_is_malformed(tmp_path):
    path = write(tmp_path / "train.csv", 'title,body,stars\nA,B,ok\n"abc"def,B,ok\n')
    assert refused(read_table, path) == f"{path}: line 3: malformed record (',' expected after '\"')"


def test_labels_in_refuses_a_null_parquet_label(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"s": ["a", "b"], "y": pd.array([1, None], dtype="Int64")}).to_parquet(path)
    assert refused(labels_in, path, "y") == f"{path}: row 1: column 'y': missing or empty label"


@pytest.mark.parametrize("cell", ["\u200b", "\ufeff", "\u0301"], ids=["zero-width", "bom", "combining"])
def test_a_text_of_characters_that_tokenize_to_nothing_is_empty(tmp_path, cell):
    """Every such row would get one answer, learned from nothing: refused as the service refuses it."""
    path = write(tmp_path / "train.jsonl", json.dumps({"title": "A", "body": cell, "stars": "ok"}))
    assert refused(read_reviews, path) == f"{path}: line 1: column 'body': empty or non-string text {cell!r}"


def test_one_label_text_per_number_and_any_other_text_as_written():
    """label_text's docstring, each clause: 1 and 1.0 and "1.0" are "1", 2.5 and "2.50" are "2.5",
    an integer's text stays as written ("007"), and 2.5 is no class 2."""
    from bertvision.data.task_files import label_text

    assert {label_text(v) for v in (1, 1.0, "1.0", " 1 ")} == {"1"}
    assert label_text(2.5) == label_text("2.50") == "2.5"
    assert label_text("007") == "007" and label_text("high") == "high"


def test_what_a_tokenizer_reads_is_readable_and_what_it_drops_is_not():
    from bertvision.data.text import readable

    assert readable("🙂") and readable("!") and readable("é")
    assert not readable("\ufffd\ufffd") and not readable("\u200b \ufeff") and not readable("\u0301")


def test_a_regression_label_past_float32_either_way_is_refused(tmp_path):
    """-1e39 became -inf as a float32 label, as 1e39 would have, which is refused."""
    for big in ("1e39", "-1e39"):
        path = write(tmp_path / "train.csv", f"s,y\na,1\nb,{big}\n")
        assert refused(read_task_file, path, "train", ("s",), ("sentence",), "y", "regression", ()) == (
            f"{path}: line 3: column 'y': label {big!r} is not a finite number"
        )


def test_a_pandas_tsv_with_quoted_cells_reads_its_texts_unquoted(tmp_path):
    """pandas quotes a cell holding a quote; read without quoting, the quotes stayed in the text."""
    import pandas as pd

    texts = ['a "quoted" word', "plain"]
    path = tmp_path / "train.tsv"
    pd.DataFrame({"text": texts, "label": ["x", "y"]}).to_csv(path, sep="\t", index=False)
    assert read_table(path)["text"].tolist() == texts


def test_one_repeated_dev_row_is_said_and_none_is_not():
    from bertvision.data.task_files import repeats_note

    assert repeats_note(1, 30, "dev").startswith("1 of 30 dev rows repeat a train row's text exactly")
    assert repeats_note(0, 30, "dev") is None


def test_a_separator_inside_one_of_several_column_names_is_no_wrong_separator(tmp_path):
    """Only a header of one column holding another separator says the file was split wrong."""
    path = write(tmp_path / "train.csv", "text;raw,label\na,x\n")
    assert read_table(path).columns.tolist() == ["text;raw", "label"]


def test_a_json_list_holding_a_record_that_is_no_object_is_refused(tmp_path):
    path = write(tmp_path / "train.json", '[{"text": "a", "label": "x"}, ["b", "y"]]')
    assert refused(read_table, path) == f"{path}: row 1: expected a JSON object, got list"
