"""Parsing the classic glue_data files: every row, exactly, and clear errors otherwise."""

import gzip

import pytest

from bertvision.data.glue_files import DataFormatError, locate, parse_split
from bertvision.registry.tasks import TASKS, get_task
from tests.conftest import SHIPPED_GLUE

# Published GLUE row counts (train, dev).
PUBLISHED = {
    "cola": (8551, 1043),
    "sst2": (67349, 872),
    "mrpc": (3668, 408),
    "stsb": (5749, 1500),
    "rte": (2490, 277),
    "wnli": (635, 71),
}


@pytest.mark.parametrize("task", sorted(PUBLISHED))
def test_shared_files_give_published_counts(shared_glue, task):
    spec = get_task(task)
    for split, expected in zip(("train", "dev"), PUBLISHED[task]):
        df = parse_split(locate(shared_glue, spec, split), spec, split)
        assert len(df) == expected
        assert df["idx"].tolist() == list(range(expected))
        assert df["label"].notna().all()


@pytest.mark.parametrize("task", sorted(PUBLISHED))
def test_shipped_files_give_published_counts(task):
    spec = get_task(task)
    for split, expected in zip(("train", "dev"), PUBLISHED[task]):
        path = locate(SHIPPED_GLUE, spec, split)
        assert path.suffix == ".gz"
        assert len(parse_split(path, spec, split)) == expected
    assert spec.train_rows == PUBLISHED[task][0]  # the registry's size, which sizes job requests


def test_cola_first_row_is_data_not_header():
    spec = get_task("cola")
    df = parse_split(locate(SHIPPED_GLUE, spec, "train"), spec, "train")
    assert df["sentence"].iloc[0] == "Our friends won't buy this analysis, let alone the next one we propose."
    assert df["label"].iloc[0] == 1


def test_mrpc_bom_header_and_labels():
    spec = get_task("mrpc")
    df = parse_split(locate(SHIPPED_GLUE, spec, "dev"), spec, "dev")
    assert set(df["label"]) == {0, 1}
    assert df["sentence1"].iloc[0].startswith("He said the foodservice pie business")


def test_stsb_scores_are_floats_in_range():
    spec = get_task("stsb")
    df = parse_split(locate(SHIPPED_GLUE, spec, "dev"), spec, "dev")
    assert df["label"].dtype == "float32"
    assert df["label"].between(0, 5).all()


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_quotes_are_literal(tmp_path):
    spec = get_task("sst2")
    path = _write(tmp_path / "SST-2" / "train.tsv", 'sentence\tlabel\n"a quoted\t1\nstart " end\t0\n')
    df = parse_split(path, spec, "train")
    assert df["sentence"].tolist() == ['"a quoted', 'start " end']


def test_wrong_field_count_names_file_and_line(tmp_path):
    spec = get_task("rte")
    path = _write(
        tmp_path / "RTE" / "dev.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\textra\tentailment\n",
    )
    with pytest.raises(DataFormatError, match=r"dev.tsv: line 3: expected 4 tab-separated fields, got 5"):
        parse_split(path, spec, "dev")


def test_unknown_label_names_file_and_line(tmp_path):
    spec = get_task("rte")
    path = _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(DataFormatError, match=r"line 2: unknown label 'maybe'"):
        parse_split(path, spec, "dev")


def test_empty_text_is_an_error(tmp_path):
    spec = get_task("sst2")
    path = _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\n \t1\n")
    with pytest.raises(DataFormatError, match=r"line 2: empty text"):
        parse_split(path, spec, "dev")


def test_gzip_and_plain_files_parse_the_same(tmp_path):
    spec = get_task("wnli")
    plain = gzip.decompress(locate(SHIPPED_GLUE, spec, "dev").read_bytes())
    path = tmp_path / "WNLI" / "dev.tsv"
    path.parent.mkdir()
    path.write_bytes(plain)
    assert locate(tmp_path, spec, "dev") == path
    a = parse_split(path, spec, "dev")
    b = parse_split(locate(SHIPPED_GLUE, spec, "dev"), spec, "dev")
    assert a.equals(b)


def test_missing_file_names_the_expected_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"MRPC/train.tsv"):
        locate(tmp_path, get_task("mrpc"), "train")


def test_registry_covers_all_of_glue_and_squad():
    assert set(TASKS) >= {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "squad2"}
    assert get_task("squad2").kind == "span" and get_task("squad2").num_labels == 2
    assert get_task("mnli").eval_splits == ("dev_matched", "dev_mismatched")
    assert get_task("stsb").num_labels == 1


def test_a_file_with_windows_line_ends_and_padded_labels_reads_as_the_plain_one(tmp_path):
    """A file saved on Windows (CRLF) kept "\\r" on each row's last field (CoLA's sentence); a label
    cell " 1 " is 1. Each row's idx is its 0-based place in the file."""
    spec = get_task("cola")
    rows = ["gj04\t1\t\tThe sailors rode the breeze.", "gj04\t0\t*\tThe more we study verbs."]
    plain = parse_split(_write(tmp_path / "a" / "CoLA" / "dev.tsv", "\n".join(rows) + "\n"), spec, "dev")
    crlf = tmp_path / "b" / "CoLA" / "dev.tsv"
    crlf.parent.mkdir(parents=True)
    crlf.write_bytes(("\r\n".join(row.replace("\t1\t", "\t 1 \t") for row in rows) + "\r\n").encode())
    assert parse_split(crlf, spec, "dev").equals(plain)
    assert plain["idx"].tolist() == [0, 1] and plain["label"].tolist() == [1, 0]
    assert plain["sentence"].tolist() == ["The sailors rode the breeze.", "The more we study verbs."]
