"""Tasks of the user's own from a Hugging Face dataset (``tasks.<name>.hub``), exercised offline
against local dataset directories laid out as hub repositories (parquet per config and split,
a ClassLabel column's names in the parquet schema): they download to the same canonical frames
as the same rows in files; what cannot be known without the dataset (labels, rows) is asked in
the config, and every bad row or column is one line naming the dataset, split, row and column."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bertvision.config.declared_tasks import declared_task
from bertvision.data.glue_files import locate, parse_split
from bertvision.data.squad_files import parse_squad
from bertvision.data.table_files import read_json_document
from bertvision.errors import ConfigError, DataFormatError
from bertvision.registry.task_spec import TaskSpec
from bertvision.registry.tasks import declared_json, get_task
from bertvision.stages.download import download_task, load_source_split
from tests.conftest import REPO, SHIPPED_GLUE, workflow_settings

datasets = pytest.importorskip("datasets")

MRPC_LABELS = ["different", "same"]
SPLITS = ("train", "selection", "dev")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def glue_rows(task: str, split: str, n: int) -> pd.DataFrame:
    spec = get_task(task)
    return parse_split(locate(SHIPPED_GLUE, spec, split), spec, split).head(n).reset_index(drop=True)


def hub_repo(root, config: str, splits: dict[str, dict], features: dict | None = None):
    """A dataset directory laid out like a hub repository: ``config/<split>-00000-of-00001.parquet``
    per split (hub split name -> columns), with ``features`` (name -> datasets feature) kept in
    the parquet schema, as ``datasets`` writes it."""
    lines = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, columns in splits.items():
        (root / config).mkdir(parents=True, exist_ok=True)
        typed = datasets.Features(features) if features else None
        datasets.Dataset.from_dict(columns, features=typed).to_parquet(
            root / config / f"{split}-00000-of-00001.parquet"
        )
        lines += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    (root / "README.md").write_text("\n".join([*lines, "---", ""]))
    return root


def mrpc_repo(root, names=tuple(MRPC_LABELS)):
    """MRPC's first rows with the label as a ClassLabel of ``names``; dev is the hub's ``test`` split."""
    features = {
        "first": datasets.Value("string"),
        "second": datasets.Value("string"),
        "label": datasets.ClassLabel(names=list(names)),
    }
    splits = {}
    for ours, theirs, n in (("train", "train", 60), ("dev", "test", 30)):
        rows = glue_rows("mrpc", ours, n)
        splits[theirs] = {"first": list(rows["sentence1"]), "second": list(rows["sentence2"]),
                          "label": [int(x) for x in rows["label"]]}  # fmt: skip
    return hub_repo(root, "pairs", splits, features)


def hub_block(repo, **over) -> dict:
    block = {
        "hub": {"id": str(repo), "config": "pairs", "splits": {"train": "train", "dev": "test"}, "rows": 60},
        "text": ["first", "second"],
        "label": "label",
        "kind": "classification",
        "labels": list(MRPC_LABELS),
    }
    return {**block, **over}


def downloaded(settings, name: str, out) -> dict[str, pd.DataFrame]:
    download_task(get_task(name), settings.download(name), out)
    return {split: pd.read_parquet(out / f"{split}.parquet") for split in SPLITS}


def refused(call, *args) -> str:
    """The one-line message of the DataFormatError that ``call`` raises."""
    with pytest.raises(DataFormatError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ---- the same rows from the hub and from files -----------------------------------------------------


def test_a_classlabel_hub_task_downloads_as_its_files_do(tmp_path):
    repo = mrpc_repo(tmp_path / "repo")
    files = {}
    for ours, n in (("train", 60), ("dev", 30)):
        rows = glue_rows("mrpc", ours, n)
        frame = pd.DataFrame({"first": rows["sentence1"], "second": rows["sentence2"],
                              "label": [MRPC_LABELS[int(x)] for x in rows["label"]]})  # fmt: skip
        files[ours] = str(tmp_path / f"pairs-{ours}.csv")
        frame.to_csv(files[ours], index=False)
    file_block = {**hub_block(repo), "files": files}
    del file_block["hub"]
    # data.source stays local: a declared hub task reads its dataset whatever data.source says
    settings = workflow_settings(tasks={"pairs-hub": hub_block(repo), "pairs-files": file_block})

    from_hub = downloaded(settings, "pairs-hub", tmp_path / "raw-hub")
    from_files = downloaded(settings, "pairs-files", tmp_path / "raw-files")
    for split in SPLITS:
        pd.testing.assert_frame_equal(from_hub[split], from_files[split])
    assert list(from_hub["dev"].columns) == ["idx", "text_a", "text_b", "label"]
    assert len(from_hub["train"]) + len(from_hub["selection"]) == 60 and len(from_hub["dev"]) == 30
    assert from_hub["dev"]["label"].tolist() == glue_rows("mrpc", "dev", 30)["label"].tolist()


def test_a_hub_declaration_travels_to_jobs_and_its_local_folders_files_are_the_downloads_inputs(tmp_path):
    repo = mrpc_repo(tmp_path / "repo")
    block = hub_block(repo)
    block["hub"]["revision"] = "main"
    settings = workflow_settings(tasks={"pairs-hub": block})
    task = get_task("pairs-hub")
    assert task.declared and task.files is None and task.hub.revision == "main"
    assert (task.hub_id, task.hub_config, task.hub_splits) == (str(repo), "pairs", {"train": "train", "dev": "test"})
    assert task.train_rows == 60 and settings.train_rows("pairs-hub") == 54  # less data.selection_fraction
    again = TaskSpec.from_dict(json.loads(declared_json([task]))["pairs-hub"])
    assert again == task
    # a local folder's files, so that one edited in place reruns the download (it ran none: edits went unseen)
    files = [repo / "README.md", *sorted((repo / "pairs").glob("*.parquet"))]
    assert settings.download("pairs-hub").source_files(task) == files
    assert len(downloaded(settings, "pairs-hub", tmp_path / "raw")["dev"]) == 30  # at revision main


@pytest.mark.parametrize(
    "labels, values",
    [
        (["negative", "positive"], lambda ids: [["negative", "positive"][i] for i in ids]),  # a string column
        (["0", "1"], lambda ids: ids),  # integers without ClassLabel: matched as "0", "1"
    ],
    ids=["strings", "integers"],
)
def test_a_label_column_without_classlabel_is_matched_as_strings(tmp_path, labels, values):
    splits = {}
    for ours, theirs in (("train", "train"), ("dev", "validation")):
        rows = glue_rows("sst2", ours, 40)
        splits[theirs] = {"sentence": list(rows["sentence"]), "sentiment": values([int(x) for x in rows["label"]])}
    repo = hub_repo(tmp_path / "repo", "default", splits)
    block = {
        "hub": {"id": str(repo), "splits": {"train": "train", "dev": "validation"}},
        "text": "sentence",
        "label": "sentiment",
        "kind": "classification",
        "labels": labels,
        "train_size": 30,  # no hub.rows: train_size sizes the jobs
    }
    settings = workflow_settings(tasks={"sentiment": block})
    assert get_task("sentiment").train_rows == 30
    frames = downloaded(settings, "sentiment", tmp_path / "raw")
    assert frames["dev"]["label"].tolist() == glue_rows("sst2", "dev", 40)["label"].tolist()
    assert frames["dev"]["text"].tolist() == glue_rows("sst2", "dev", 40)["sentence"].tolist()
    assert len(frames["train"]) + len(frames["selection"]) == 30


def test_a_regression_hub_task(tmp_path):
    splits = {}
    for ours, theirs in (("train", "train"), ("dev", "validation")):
        rows = glue_rows("stsb", ours, 40)
        splits[theirs] = {"a": list(rows["sentence1"]), "b": list(rows["sentence2"]), "score": list(rows["label"])}
    repo = hub_repo(tmp_path / "repo", "scores", splits)
    block = {
        "hub": {"id": str(repo), "config": "scores", "splits": {"train": "train", "dev": "validation"}, "rows": 40},
        "text": ["a", "b"],
        "label": "score",
        "kind": "regression",
    }
    settings = workflow_settings(tasks={"similar": block})
    frames = downloaded(settings, "similar", tmp_path / "raw")
    expected = glue_rows("stsb", "dev", 40)["label"].astype("float32")
    assert frames["dev"]["label"].dtype == "float32"
    assert frames["dev"]["label"].tolist() == expected.tolist()


def test_a_span_hub_task_downloads_as_its_squad_files_do(tmp_path):
    """A squad_v2-shaped dataset (answers as {text, answer_start}) and the same articles' SQuAD 2.0 files."""
    articles = read_json_document(REPO / "resources/squad2/dev-v2.0.json.gz")[0]["data"]
    files, splits = {}, {}
    for ours, theirs, part in (("train", "train", articles[:6]), ("dev", "validation", articles[6:7])):
        files[ours] = tmp_path / f"faq-{ours}.json"
        files[ours].write_text(json.dumps({"version": "v2.0", "data": part}))
        rows = parse_squad(files[ours])
        answers = [
            {"text": list(t), "answer_start": list(s)} for t, s in zip(rows["answer_texts"], rows["answer_starts"])
        ]
        splits[theirs] = {**{k: list(rows[k]) for k in ("id", "title", "context", "question")}, "answers": answers}
    repo = hub_repo(tmp_path / "repo", "squad_v2", splits)
    hub = {"id": str(repo), "config": "squad_v2", "splits": {"train": "train", "dev": "validation"}, "rows": 500}
    settings = workflow_settings(
        tasks={
            "faq-hub": {"hub": hub, "kind": "span", "max_length": 128},
            "faq-files": {"files": {k: str(v) for k, v in files.items()}, "kind": "span", "max_length": 128},
        }
    )
    assert get_task("faq-hub").span and get_task("faq-hub").train_rows == 500
    from_hub = downloaded(settings, "faq-hub", tmp_path / "raw-hub")
    from_files = downloaded(settings, "faq-files", tmp_path / "raw-files")
    for split in SPLITS:
        pd.testing.assert_frame_equal(from_hub[split], from_files[split])


# ---- the dataset is not what the config says: one line --------------------------------------------


def test_classlabel_names_other_than_the_declared_labels(tmp_path):
    repo = mrpc_repo(tmp_path / "repo", names=("same", "different"))
    settings = workflow_settings(tasks={"pairs-hub": hub_block(repo)})
    message = refused(download_task, get_task("pairs-hub"), settings.download("pairs-hub"), tmp_path / "raw")
    assert message == (
        f"{repo}/pairs split train: column 'label': the dataset's ClassLabel names ['same', 'different'] "
        "are not tasks.pairs-hub.labels ['different', 'same'] (the same labels in the same order)"
    )
    assert not (tmp_path / "raw").exists()


def test_a_missing_text_column_lists_the_columns_found(tmp_path):
    repo = mrpc_repo(tmp_path / "repo")
    settings = workflow_settings(tasks={"pairs-hub": hub_block(repo, text=["first", "third"])})
    message = refused(download_task, get_task("pairs-hub"), settings.download("pairs-hub"), tmp_path / "raw")
    assert (
        message == f"{repo}/pairs split train: missing column(s) ['third']; columns found: ['first', 'second', 'label']"
    )


@pytest.mark.parametrize(
    "split, column, row, value, expected",
    [
        ("train", "second", 3, "  ", "train: row 3: column 'second': empty or non-string text '  '"),
        ("dev", "label", 5, -1, "test: row 5: column 'label': unknown label -1 in dev; expected one of"),
    ],
    ids=["empty-text", "no-label"],
)
def test_a_bad_row_is_named_by_dataset_split_row_and_column(tmp_path, split, column, row, value, expected):
    rows = glue_rows("mrpc", "dev", 10)
    columns = {"first": list(rows["sentence1"]), "second": list(rows["sentence2"]), "label": list(rows["label"])}
    columns[column][row] = value
    features = {"first": datasets.Value("string"), "second": datasets.Value("string"),
                "label": datasets.ClassLabel(names=MRPC_LABELS)}  # fmt: skip
    repo = hub_repo(tmp_path / "repo", "pairs", {"train": columns, "test": columns}, features)
    settings = workflow_settings(tasks={"pairs-hub": hub_block(repo)})
    message = refused(load_source_split, get_task("pairs-hub"), split, settings.download("pairs-hub"))
    assert message.startswith(f"{repo}/pairs split {expected}")


# ---- what the config must say, since the workflow never reads the dataset -------------------------


HUB = {"id": "org/data", "splits": {"train": "train", "dev": "test"}, "rows": 100}


@pytest.mark.parametrize(
    "block, message",
    [
        (
            {"hub": HUB, "text": "t", "label": "l", "kind": "classification"},
            "tasks.mine.labels: a classification task from the hub lists its labels in id order",
        ),
        (
            {"hub": {**HUB, "rows": None}, "text": "t", "label": "l", "kind": "regression"},
            "tasks.mine.hub.rows: give the train split's row count",
        ),
        ({"hub": HUB, "label": "l", "kind": "regression"}, "tasks.mine: a regression task of your own names its text"),
    ],
    ids=["no-labels", "no-rows", "no-text"],
)
def test_a_hub_declaration_without_what_parsing_needs(block, message):
    block = {**block, "hub": {k: v for k, v in block["hub"].items() if v is not None}}
    with pytest.raises(ConfigError) as caught:
        declared_task("mine", block)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_question_task_from_the_hub_needs_no_labels():
    task = declared_task("faq", {"hub": HUB, "kind": "answerability"})
    assert task.answerability and task.label_names == ("answerable", "no_answer") and task.train_rows == 100


@pytest.mark.parametrize(
    "block, message",
    [
        ({"files": {"train": "a.csv", "dev": "b.csv"}, "hub": HUB, "text": "t", "label": "l", "kind": "regression"},
         "tasks.mine: 'hub' and 'files' exclude each other: give one of them"),
        ({"hub": {**HUB, "splits": {"train": "train"}}, "text": "t", "label": "l", "kind": "regression"},
         "tasks.mine.hub.splits: 'dev' is a required property"),
        ({"hub": HUB, "text": "t", "label": "l"}, "tasks.mine: 'kind' is a dependency of 'hub'"),
        ({"hub": {**HUB, "rows": 0}, "text": "t", "label": "l", "kind": "regression"},
         "tasks.mine.hub.rows: 0 is less than the minimum of 1"),
    ],
    ids=["files-and-hub", "no-dev-split", "no-kind", "no-rows"],
)  # fmt: skip
def test_the_schema_refuses_a_bad_hub_block(block, message):
    with pytest.raises(ConfigError) as caught:
        workflow_settings(tasks={"mine": block})
    assert str(caught.value) == f"config: {message}"


def test_a_split_a_local_dataset_lacks_is_one_line_with_no_network_advice(tmp_path):
    """A local dataset directory given where a hub id goes: a split it lacks was met with advice to
    run the download where the hub answers."""
    import datasets

    from bertvision.data.hub import hub_dataset
    from bertvision.errors import MissingError

    folder = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [0, 1]})}).save_to_disk(
        str(folder)
    )
    with pytest.raises(MissingError) as err:
        hub_dataset(str(folder), split="test")
    assert str(err.value).startswith(f"{folder} (split test): not in this dataset (Unknown split")
    assert "network" not in str(err.value)


def test_a_declared_split_of_no_rows_is_refused_naming_it(tmp_path):
    """A declared split that holds no rows (an empty parquet file, its columns typed) is refused
    in one line naming the dataset and split (datasets refuses to load it: it was said not to be
    in the dataset)."""
    features = {"first": datasets.Value("string"), "second": datasets.Value("string"),
                "label": datasets.ClassLabel(names=MRPC_LABELS)}  # fmt: skip
    rows = glue_rows("mrpc", "train", 60)
    train = {"first": list(rows["sentence1"]), "second": list(rows["sentence2"]),
             "label": [int(x) for x in rows["label"]]}  # fmt: skip
    repo = hub_repo(tmp_path / "repo", "pairs", {"train": train, "test": {"first": [], "second": [], "label": []}},
                    features)  # fmt: skip
    settings = workflow_settings(tasks={"pairs-hub": hub_block(repo)})
    message = refused(download_task, get_task("pairs-hub"), settings.download("pairs-hub"), tmp_path / "raw")
    assert message == f"{repo} (split test, config pairs): no rows"
