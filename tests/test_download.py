"""The download stage: seeded subsampling, a selection split disjoint from train, and the
hub code path exercised against a local dataset repository."""

import copy
import json
import os
import re
import shutil

import pandas as pd
import pytest
import yaml

from bertvision.data.glue_files import locate, parse_split
from bertvision.layout import rows_record
from bertvision.registry.tasks import get_task
from bertvision.stages.download import carve_selection, download_task, subsample
from tests.conftest import REPO, SHIPPED_GLUE, snakemake, squad_slice, workflow_settings


def settings(**kw):
    """The download settings of MRPC in a default config, with ``kw`` replaced."""
    return workflow_settings().download("mrpc").replace(**kw)


def test_local_download_writes_all_splits(tmp_path):
    counts = download_task(get_task("mrpc"), settings(train_size=500), tmp_path)
    assert counts == {"train": 450, "selection": 50, "dev": 408}
    train = pd.read_parquet(tmp_path / "train.parquet")
    sel = pd.read_parquet(tmp_path / "selection.parquet")
    assert not set(train["idx"]) & set(sel["idx"])
    assert list(train.columns) == ["idx", "sentence1", "sentence2", "label"]


def test_download_is_deterministic_and_seeded(tmp_path):
    task = get_task("sst2")
    download_task(task, settings(train_size=300), tmp_path / "a")
    download_task(task, settings(train_size=300), tmp_path / "b")
    download_task(task, settings(train_size=300, seed=14), tmp_path / "c")
    a, b, c = (pd.read_parquet(tmp_path / d / "train.parquet") for d in "abc")
    assert a.equals(b)
    assert not a["idx"].equals(c["idx"])


def test_the_rows_record_says_how_many_rows_were_drawn_from_how_many(tmp_path):
    download_task(get_task("mrpc"), settings(train_size=500, eval_size=100), tmp_path)
    record = json.loads(rows_record(tmp_path).read_text())
    full_train = len(parse_split(locate(SHIPPED_GLUE, get_task("mrpc"), "train"), get_task("mrpc"), "train"))
    assert record["drawn"] == {
        "train": {"rows": 500, "of": full_train, "asked": 500, "before_selection": True},
        "selection": {"rows": 50, "of": 50, "asked": None},
        "dev": {"rows": 100, "of": 408, "asked": 100},
    }


def test_a_size_larger_than_its_split_is_said_in_the_log_the_record_and_the_summary(tmp_path, caplog):
    """train_size, selection_size and eval_size past the rows there are: all rows, as before, but
    one warning line each naming the key, and the summary's Drawn line says so (it said nothing)."""
    from bertvision.reporting.summary_page import drawn_line

    caplog.set_level("WARNING", logger="bertvision.stages.download")
    download_task(get_task("rte"), settings(train_size=5000, selection_size=400, eval_size=300), tmp_path)
    warned = [r.getMessage() for r in caplog.records if "rows asked" in r.getMessage()]
    assert warned == [
        "tasks.rte.train_size: 5000 rows asked, but the train split has 2490: all 2490 drawn",
        "tasks.rte.selection_size: 400 rows asked, but the selection split has 249: all 249 drawn",
        "tasks.rte.eval_size: 300 rows asked, but the dev split has 277: all 277 drawn",
    ]
    record = json.loads(rows_record(tmp_path).read_text())
    assert record["drawn"]["train"] == {"rows": 2490, "of": 2490, "asked": 5000, "before_selection": True}
    assert drawn_line(record) == (
        "Drawn with data.seed: all 2,490 train rows (asked 5,000), all 249 selection rows (asked 400), "
        "all 277 dev rows (asked 300)."
    )


def test_a_train_split_left_with_one_label_after_the_selection_carve_is_refused(tmp_path):
    """Two rows, one of each label: the selection split takes one, train keeps one label only."""
    from bertvision.errors import DataFormatError

    with pytest.raises(DataFormatError) as err:
        download_task(get_task("mrpc"), settings(train_size=2, selection_fraction=0.5), tmp_path / "out")
    message = str(err.value)
    assert "the 1 train rows left after tasks.mrpc.train_size and the selection split" in message
    assert len(message.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_regression_selection_split_that_cannot_score_is_refused(tmp_path):
    """Twelve STS-B rows leave one selection row at the default share: Pearson is undefined on it (every
    method scored 0 and the summary named a winner); refused in one line, nothing written."""
    from bertvision.errors import DataFormatError

    with pytest.raises(DataFormatError) as err:
        download_task(get_task("stsb"), settings(train_size=12), tmp_path / "out")
    message = str(err.value)
    assert "the 1 selection row(s) carved from train (data.selection_fraction, tasks.stsb.selection_size)" in message
    assert len(message.splitlines()) == 1 and not (tmp_path / "out").exists()
    download_task(get_task("stsb"), settings(train_size=40), tmp_path / "kept")  # four rows that vary


def test_full_download_keeps_every_row(tmp_path):
    task = get_task("rte")
    counts = download_task(task, settings(), tmp_path)
    assert counts["train"] + counts["selection"] == 2490 and counts["dev"] == 277


def test_subsample_and_selection_edge_cases():
    df = pd.DataFrame({"idx": range(10)})
    assert len(subsample(df, None, 0)) == 10 and len(subsample(df, 100, 0)) == 10
    train, sel = carve_selection(df, 0.01, 0)
    assert len(sel) == 1 and len(train) == 9
    with pytest.raises(ValueError, match="leaves no training rows"):
        carve_selection(df.iloc[:1], 0.5, 0)


@pytest.fixture
def local_hub_repo(tmp_path):
    """A dataset repository laid out like nyu-mll/glue (parquet per config and split)."""
    datasets = pytest.importorskip("datasets")  # noqa: F841
    task = get_task("mrpc")
    repo = tmp_path / "glue-repo"
    for split, hub_split in task.hub_splits.items():
        df = parse_split(locate(SHIPPED_GLUE, task, split), task, split).iloc[:40]
        df = df.assign(label=df["label"].astype("int64"))
        (repo / "mrpc").mkdir(parents=True, exist_ok=True)
        df[["sentence1", "sentence2", "label", "idx"]].to_parquet(repo / "mrpc" / f"{hub_split}-00000-of-00001.parquet")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: mrpc\n  data_files:\n"
        "  - split: train\n    path: mrpc/train-*\n  - split: validation\n    path: mrpc/validation-*\n---\n"
    )
    return repo


def test_hub_path_with_a_local_repository(tmp_path, local_hub_repo, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    counts = download_task(get_task("mrpc"), settings(source="hub", hub_repo=str(local_hub_repo)), tmp_path / "out")
    assert counts == {"train": 36, "selection": 4, "dev": 40}
    local = parse_split(locate(SHIPPED_GLUE, get_task("mrpc"), "dev"), get_task("mrpc"), "dev").iloc[:40]
    hub = pd.read_parquet(tmp_path / "out" / "dev.parquet")
    assert hub["sentence1"].tolist() == local["sentence1"].tolist()
    assert hub["label"].tolist() == local["label"].tolist()


def test_a_local_repository_edited_in_place_is_read_anew(tmp_path, local_hub_repo, monkeypatch):
    """datasets caches a local folder by its name and file patterns: the second download read the
    first one's rows from that cache (data.hub_repo had no cache of its own, as declared tasks do)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    hub = settings(source="hub", hub_repo=str(local_hub_repo))
    download_task(get_task("mrpc"), hub, tmp_path / "first")
    dev_file = next((local_hub_repo / "mrpc").glob("validation-*"))
    rows = pd.read_parquet(dev_file)
    rows.assign(sentence1=[f"edited {i}" for i in range(len(rows))]).to_parquet(dev_file)
    download_task(get_task("mrpc"), hub, tmp_path / "second")
    assert pd.read_parquet(tmp_path / "second" / "dev.parquet")["sentence1"].tolist() == [
        f"edited {i}" for i in range(len(rows))
    ]


def test_squad_from_a_glue_mirror_is_one_line_naming_hub_repo(tmp_path, local_hub_repo, monkeypatch):
    """GLUE tasks and squad2 under one data.hub_repo: squad2 read the GLUE mirror and failed
    with a 40-line KeyError: 'id'."""
    from bertvision.errors import DataFormatError

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    config = workflow_settings(
        tasks={"mrpc": None, "squad2": None}, data={"source": "hub", "hub_repo": str(local_hub_repo)}
    )
    with pytest.raises(DataFormatError) as err:
        download_task(get_task("squad2"), config.download("squad2"), tmp_path / "out")
    message = str(err.value)
    assert message.startswith(f"data.hub_repo: {local_hub_repo} split train: ")
    assert "missing column(s) ['id', 'title', 'context', 'question', 'answers']" in message
    assert "\n" not in message


def test_rows_that_repeat_a_train_rows_texts_are_counted_in_the_log(tmp_path, caplog):
    """STS-B's dev repeats 6 of train's pairs (docs/results/dev-train-repeats.txt): kept and scored
    as given, and said; MRPC's dev repeats none, and nothing is said."""
    caplog.set_level("WARNING", logger="bertvision.stages.download")
    download_task(
        get_task("stsb"),
        workflow_settings().download("stsb").replace(train_size=None, eval_size=None),
        tmp_path / "stsb",
    )
    download_task(get_task("mrpc"), settings(train_size=None), tmp_path / "mrpc")
    dev = [r.getMessage() for r in caplog.records if " dev rows " in r.getMessage()]
    assert len(dev) == 1 and dev[0].startswith("stsb: 6 of 1500 dev rows repeat a train row's text exactly")
    # and recorded beside the rows, for the summary (tables stage)
    stsb, mrpc = (json.loads(rows_record(tmp_path / t).read_text()) for t in ("stsb", "mrpc"))
    assert stsb["task"] == "stsb" and stsb["repeated"]["dev"] == 6 and stsb["rows"]["dev"] == 1500
    assert mrpc["repeated"]["dev"] == 0 and mrpc["rows"] == {s: len(pd.read_parquet(tmp_path / "mrpc" / f"{s}.parquet"))
                                                         for s in ("train", "selection", "dev")}  # fmt: skip


# ---- what reruns a download: the settings and files it reads, and nothing else ----------------------
def planned_downloads(workdir, config: dict) -> list[str]:
    """The tasks whose download a dry run of ``config`` (as the run's config) would run."""
    (workdir / "plan.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(workdir, "-n", "--until", "download", "--configfile", str(workdir / "plan.yaml")).stdout
    return sorted(re.findall(r"rule download:\n(?:\s+.*\n)*?\s+wildcards: task=([\w-]+)", out))


@pytest.fixture(scope="module")
def downloaded_run(tmp_path_factory):
    """GLUE, SQuAD (article split) and a declared hub task from a local folder, downloaded by
    Snakemake: (the working directory, its config)."""
    from tests.test_own_task_hub import mrpc_repo
    from tests.tiny_bert import DEFAULT_BACKBONE

    workdir = tmp_path_factory.mktemp("downloads")
    repo = mrpc_repo(workdir / "pairs-repo")
    config = {
        "backbones": {"m": {"pretrained": DEFAULT_BACKBONE}},
        "tasks": {
            "sst2": {"train_size": 60, "eval_size": 40},
            "stsb": {"train_size": 60, "eval_size": 40},
            "squad2": squad_slice(30, 20, 30),
            "pairs": {
                "hub": {"id": str(repo), "config": "pairs", "splits": {"train": "train", "dev": "test"}},
                "text": ["first", "second"],
                "label": "label",
                "kind": "classification",
                "labels": ["different", "same"],
                "train_size": 40,
            },
        },
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake(workdir, "--until", "download")
    return workdir, config, repo


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, rerun",
    [
        # a setting each task reads: its download alone reruns (each reran every download)
        (lambda c, tmp: c.update(data={"squad_dir": str(shutil.copytree(REPO / "resources/squad2", tmp / "sq"))}),
         ["squad2"]),
        (lambda c, tmp: c.update(data={"hub_repo": "org/glue-mirror"}), []),  # read under source: hub only
        (lambda c, tmp: c.update(data={"selection_fraction": 0.2}), ["pairs", "sst2", "stsb"]),  # not an article split
        (lambda c, tmp: c.update(data={"source": "hub"}), ["squad2", "sst2", "stsb"]),  # a declared task reads its own
        (lambda c, tmp: c.update(data={"seed": 14}), ["pairs", "squad2", "sst2", "stsb"]),
    ],
    ids=["squad_dir", "hub_repo", "selection_fraction", "source", "seed"],
)  # fmt: skip
def test_a_setting_reruns_only_the_downloads_that_read_it(downloaded_run, tmp_path, change, rerun):
    workdir, config, _ = downloaded_run
    config = copy.deepcopy(config)
    change(config, tmp_path)
    assert planned_downloads(workdir, config) == rerun


@pytest.mark.slow
def test_an_edited_local_dataset_folder_reruns_its_download(downloaded_run):
    """A declared hub task's local folder, rows rewritten in place: the dry run had nothing to do."""
    workdir, config, repo = downloaded_run
    assert planned_downloads(workdir, config) == []
    parquet = next((repo / "pairs").glob("test-*.parquet"))
    before, stat = parquet.read_bytes(), parquet.stat()
    rows = pd.read_parquet(parquet)
    rows.assign(first=[f"edited {i}" for i in range(len(rows))]).to_parquet(parquet)
    try:
        assert planned_downloads(workdir, config) == ["pairs"]
    finally:  # the module's run as it was, for the tests beside this one
        parquet.write_bytes(before)
        os.utime(parquet, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize(
    "label, text", [(-1, "fine"), (2, "fine"), (1, " \u200b ")], ids=["test-split", "past-the-labels", "empty"]
)
def test_a_hub_mirror_row_outside_the_tasks_labels_or_without_text_is_refused(tmp_path, local_hub_repo, label, text):
    """GLUE's test splits label every row -1; a mirror's label 2 on MRPC is no class; an empty text
    reads as nothing: each refused in one line naming the row, not trained on."""
    from bertvision.data.hub import load_hub_split
    from bertvision.errors import DataFormatError

    path = local_hub_repo / "mrpc" / "validation-00000-of-00001.parquet"
    df = pd.read_parquet(path)
    df.loc[3, "label"], df.loc[3, "sentence1"] = label, text
    df.to_parquet(path)
    with pytest.raises(DataFormatError, match=r"split validation: row 3: (label|empty text)"):
        load_hub_split(get_task("mrpc"), "dev", str(local_hub_repo))
