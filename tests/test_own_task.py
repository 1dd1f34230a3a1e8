"""Tasks of the user's own, declared in the config (``tasks.<name>.files``): a CSV pair task with
three classes whose quoted fields hold commas and newlines, a gzipped JSON Lines pair task and a
Parquet regression task, made from the shipped GLUE rows, go through the whole workflow on the
tiny BERT and are answered over HTTP; bad declarations are one line naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bertvision import layout as L
from bertvision.data.glue_files import locate, parse_split
from bertvision.data.table_files import read_json_document
from bertvision.registry.tasks import get_task
from tests.conftest import REPO, SHIPPED_GLUE, job_counts, snakemake
from tests.test_own_task_hub import hub_block, mrpc_repo

BANDS = ("low", "mid", "high")
PAIR_MEANINGS = ("different", "same")  # paraphrase's 0/1 and the hub task's names: one label space


def glue_rows(task: str, split: str, n: int) -> pd.DataFrame:
    return parse_split(locate(SHIPPED_GLUE, get_task(task), split), get_task(task), split).head(n)


def band(score: float) -> str:
    return BANDS[0] if score < 2 else BANDS[1] if score < 3.5 else BANDS[2]


def write_own_files(root) -> dict:
    """The three tasks' files and their config blocks."""
    root.mkdir(parents=True, exist_ok=True)
    blocks = {}
    for split, n in (("train", 60), ("dev", 30)):
        sts = glue_rows("stsb", split, n)
        # every third pair's first sentence gets a comma and a line break: CSV quoting must keep them
        first = [s + (',\n"quoted", too' if i % 3 == 0 else "") for i, s in enumerate(sts["sentence1"])]
        bands = [band(x) for x in sts["label"]]
        similarity = pd.DataFrame({"first sentence": first, "second, sentence": sts["sentence2"], "band": bands})
        similarity.to_csv(root / f"similarity-{split}.csv", index=False)
        mrpc = glue_rows("mrpc", split, n)
        records = [
            {"a": a, "b": b, "same": int(y)} for a, b, y in zip(mrpc["sentence1"], mrpc["sentence2"], mrpc["label"])
        ]
        pd.DataFrame(records).to_json(root / f"paraphrase-{split}.jsonl.gz", orient="records", lines=True)
        pd.DataFrame({"sentence": sts["sentence2"], "score": sts["label"].astype(float)}).to_parquet(
            root / f"score-{split}.parquet"
        )
    # unlabelled files: predicted by the picked path, never scored
    unseen = glue_rows("stsb", "dev", 50).tail(20)
    ids, firsts = [f"q{i}" for i in range(len(unseen))], [s + ",\nso" for s in unseen["sentence1"]]
    pd.DataFrame({"id": ids, "first sentence": firsts, "second, sentence": unseen["sentence2"]}).to_csv(
        root / "similarity-test.csv", index=False
    )
    # a nested column (a Parquet struct, as a JSON object): copied to the predictions as JSON text
    pd.DataFrame({"sentence": unseen["sentence1"], "meta": [{"n": i} for i in range(len(unseen))]}).to_parquet(
        root / "score-test.parquet"
    )
    # a question task of one's own: SQuAD 2.0-format files, a few of the shipped file's articles each
    articles = read_json_document(REPO / "resources/squad2/dev-v2.0.json.gz")[0]["data"]
    for split, part in (("train", articles[:4]), ("dev", articles[4:6])):
        (root / f"faq-{split}.json").write_text(json.dumps({"version": "v2.0", "data": part}))
    files = lambda name, suffix: {s: str(root / f"{name}-{s}.{suffix}") for s in ("train", "dev")}  # noqa: E731
    window = {"max_length": 128, "doc_stride": 64, "train_size": 30, "selection_size": 10, "eval_size": 20}
    blocks["faq"] = {"files": files("faq", "json"), "kind": "span", "heads": ["lp"], **window}
    blocks["faq-answerable"] = {"files": files("faq", "json"), "kind": "answerability", **window}
    blocks["similarity"] = {"files": files("similarity", "csv"), "text": ["first sentence", "second, sentence"],
                            "label": "band", "kind": "classification", "labels": list(BANDS),
                            "max_length": 64}  # fmt: skip
    blocks["similarity"]["files"]["test"] = str(root / "similarity-test.csv")
    blocks["paraphrase"] = {"files": files("paraphrase", "jsonl.gz"), "text": ["a", "b"], "label": "same",
                            "kind": "classification", "max_length": 64}  # fmt: skip
    blocks["score"] = {"files": files("score", "parquet"), "text": "sentence", "label": "score", "kind": "regression",
                       "max_length": 32}  # fmt: skip
    blocks["score"]["files"]["test"] = str(root / "score-test.parquet")
    # every stage for them, as for the registry's tasks: token-level states (token-pool and the
    # ladder) and a search on the CSV task, states streamed for the Parquet task
    blocks["similarity"].update(token_features=True, search_heads=["adapter8"])
    blocks["paraphrase"].update(label_meanings=list(PAIR_MEANINGS))
    blocks["score"].update(store=False)
    # a dataset from the hub (a local directory laid out as a hub repository stands in for it)
    repo = mrpc_repo(root / "hub-pairs")
    blocks["pairs-hub"] = hub_block(repo, label_meanings=list(PAIR_MEANINGS), max_length=64, heads=["lp"])
    return blocks


def own_config(tiny_bert, blocks: dict) -> dict:
    return {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {"selection_fraction": 0.2},
        "tasks": blocks,
        "finetune": {"epoch_fractions": [0, 1.0], "settings": {"batch_size": 8}},
        "baseline": {"epochs": 1, "seeds": [1]},
        "extract": {"shards": 1, "batch_size": 16},
        "resources": {"threads": 1},
        "heads": {
            "seeds": [1],
            "training": {"max_epochs": 2, "patience": 1, "batch_size": 16},
            "models": {
                "lp": {"type": "lp"},
                "adapter8": {"type": "adapter", "width": 8},
                "tokpool": {"type": "token-pool"},
                "ladder": {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 1, "init": "encoder"},
            },
        },
        "search": {"trials": 2, "workers": 1, "space": {"width": {"choices": [4, 8]}}},
        "experiments": {
            "data_fraction": {"tasks": ["paraphrase"], "heads": ["lp"], "fractions": [0.5], "checkpoints": [1.0]},
            "transfer": {"tasks": ["score"]},
        },
        # one encoder for two tasks of one's own: the frozen one, each one's own, and a mixture
        "shared": {
            "tasks": ["paraphrase", "pairs-hub"],
            "heads": ["lp"],
            "mixtures": {"own-mix": {"tasks": ["paraphrase", "pairs-hub"], "epochs": 1}},
        },
    }


def own_settings(config: dict):
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings

    return WorkflowSettings(validate_config(config, source="own.yaml"), source="own.yaml")


@pytest.fixture(scope="module")
def own_run(tiny_bert, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("own-task")
    blocks = write_own_files(workdir / "data")
    (workdir / "config.yaml").write_text(yaml.safe_dump(own_config(tiny_bert, blocks)))
    snakemake(workdir)
    return workdir, blocks


@pytest.mark.slow
def test_own_files_go_through_every_stage_and_are_served(own_run):
    import os

    import httpx

    from bertvision.errors import DataFormatError
    from bertvision.serving.app import ServeSettings, create_app
    from bertvision.serving.predictions import predict_unlabelled
    from tests.http_server import Server

    workdir, blocks = own_run
    # every row of the CSV, commas and line breaks kept, split between train and selection
    source = pd.read_csv(blocks["similarity"]["files"]["train"], keep_default_na=False)
    raw = pd.concat([pd.read_parquet(workdir / f"data/raw/similarity/{s}.parquet") for s in ("train", "selection")])
    assert sorted(raw["idx"]) == list(range(len(source)))
    by_idx = raw.set_index("idx")
    assert (by_idx.loc[source.index, "text_a"].to_numpy() == source["first sentence"].to_numpy()).all()
    assert any("\n" in t and "," in t for t in by_idx["text_a"])
    assert (by_idx.loc[source.index, "label"].to_numpy() == source["band"].map(BANDS.index).to_numpy()).all()

    summary = pd.read_csv(workdir / "results/tables/summary.csv")
    assert set(summary["task"]) == set(blocks)
    picks = json.loads((workdir / "results/tables/picks.json").read_text())
    assert {p["task"] for p in picks["picks"]} == set(blocks)
    glue = pd.read_csv(workdir / "results/tables/glue.csv")
    assert set(glue.loc[glue["task"] == "similarity", "metric"]) == {"f1_macro", "accuracy"}
    assert set(glue.loc[glue["task"] == "score", "metric"]) == {"pearson", "spearman"}

    # every stage ran for them: the search, the experiments, token-level states, the ladder,
    # streamed states, and the shared encoders, the mixture's included, with the heads of one
    # task answering the other (their label meanings match)
    tables = {name: pd.read_csv(workdir / L.table(name, "csv")) for name in ("search", "data_fraction", "transfer")}
    assert "similarity" in set(tables["search"]["task"]) and "paraphrase" in set(tables["data_fraction"]["task"])
    assert "score" in set(tables["transfer"]["task"])
    heads = workdir / "heads/tiny"
    assert (heads / "similarity/ft1/ckpt-1/tokpool/seed1/metrics.json").exists()
    assert (heads / "similarity/ft1/ckpt-1/ladder/seed1/metrics.json").exists()
    streamed = json.loads((heads / "score/ft1/ckpt-1/lp/seed1/metrics.json").read_text())
    assert streamed["features_stored"] is False
    cross = pd.read_csv(workdir / L.table("cross_task", "csv"))
    assert {"paraphrase", "pairs-hub"} <= set(cross["task"]) and "own-mix" in set(cross["encoder"])
    hub_raw = pd.read_parquet(workdir / "data/raw/pairs-hub/dev.parquet")
    assert len(hub_raw) == 30 and set(hub_raw["label"]) <= {0, 1}

    picked_dir = workdir / L.PICKED_BUNDLES_DIR.format(model="tiny")
    with Server(create_app(picked_dir, ServeSettings(device="cpu"))) as running:
        client = httpx.Client(base_url=running.url, timeout=60)
        tasks = client.get("/tasks").json()["tasks"]
        assert set(tasks) == set(blocks)
        pair = ["A man is playing a guitar.", "A man plays the guitar."]
        answers = client.post("/predict", json={"texts": [pair], "tasks": ["similarity", "paraphrase"]})
        assert answers.status_code == 200, answers.text
        prediction = answers.json()["predictions"][0]
        assert prediction["similarity"]["label"] in BANDS
        assert prediction["paraphrase"]["label"] in ("0", "1")
        question = {"question": "Who plays?", "context": "A man plays the guitar in the park."}
        asked = client.post("/predict", json={"qa": [question], "tasks": ["faq", "faq-answerable"]})
        assert asked.status_code == 200, asked.text
        answer = asked.json()["answers"][0]
        assert "answer" in answer["faq"] and answer["faq-answerable"]["label"] in ("answerable", "no_answer")
        single = client.post("/predict", json={"texts": ["A man plays the guitar."], "tasks": ["score"]})
        assert single.status_code == 200 and isinstance(single.json()["predictions"][0]["score"]["score"], float)
        v2 = client.post(
            "/v2/models/similarity/infer",
            json={"inputs": [{"name": "text_a", "shape": [1], "datatype": "BYTES", "data": [pair[0]]},
                             {"name": "text_b", "shape": [1], "datatype": "BYTES", "data": [pair[1]]}]},
        )  # fmt: skip
        assert v2.status_code == 200, v2.text

        # the unlabelled files, every row in file order, answered as the service answers them
        for task, columns in (("similarity", ["first sentence", "second, sentence"]), ("score", ["sentence"])):
            unlabelled = blocks[task]["files"]["test"]
            given = (
                pd.read_csv(unlabelled, keep_default_na=False) if task == "similarity" else pd.read_parquet(unlabelled)
            )
            predicted = pd.read_csv(workdir / L.PREDICTIONS_FILE.format(model="tiny", task=task), keep_default_na=False)
            assert predicted[columns].to_numpy().tolist() == given[columns].to_numpy().tolist(), task
            assert list(predicted.columns[: len(given.columns)]) == list(given.columns)  # every column kept, ids too
            texts = [list(row) if len(row) == 2 else row[0] for row in given[columns].head(4).itertuples(index=False)]
            served = client.post("/predict", json={"texts": texts, "tasks": [task]}).json()["predictions"]
            label = blocks[task]["label"]
            if task == "similarity":
                assert set(predicted[label]) <= set(BANDS)
                assert predicted[label].head(4).tolist() == [p[task]["label"] for p in served]
                probabilities = predicted[[f"probability_{b}" for b in BANDS]].to_numpy()
                assert abs(probabilities.sum(axis=1) - 1).max() < 1e-5
            else:
                assert predicted[label].head(4).tolist() == pytest.approx([p[task]["score"] for p in served], abs=1e-5)
                assert predicted["meta"].head(2).tolist() == ['{"n": 0}', '{"n": 1}']  # JSON, not Python's repr

    # a column of the file where a prediction goes is refused, not overwritten (the label column is)
    unlabelled = Path(blocks["similarity"]["files"]["test"])
    given, before = unlabelled.read_bytes(), unlabelled.stat()
    rows = pd.read_csv(unlabelled, keep_default_na=False)
    rows.assign(probability_high="KEEP").to_csv(unlabelled, index=False)
    own_settings(yaml.safe_load((workdir / "config.yaml").read_text()))  # declares the tasks in this process
    try:
        with pytest.raises(DataFormatError, match=f"{unlabelled}: column 'probability_high' is where the predictions"):
            predict_unlabelled(get_task("similarity"), picked_dir, workdir / "clash.csv")
    finally:  # the module's run as it was, for the tests after this one
        unlabelled.write_bytes(given)
        os.utime(unlabelled, (before.st_atime, before.st_mtime))


def test_a_declared_task_is_a_task_like_the_registrys(tiny_bert, tmp_path):
    blocks = write_own_files(tmp_path / "data")
    settings = own_settings(own_config(tiny_bert, blocks))
    similarity = get_task("similarity")
    assert similarity.label_names == BANDS and similarity.is_pair and similarity.primary_metric == "f1_macro"
    assert get_task("paraphrase").label_names == ("0", "1")  # the train file's labels, sorted
    assert get_task("score").kind == "regression" and get_task("score").train_rows == 60
    assert settings.max_length("score") == 32 and settings.train_rows("similarity") == 48
    questions = sum(len(p["qas"]) for a in json.loads(Path(blocks["faq"]["files"]["train"]).read_text())["data"]
                    for p in a["paragraphs"])  # fmt: skip
    assert get_task("faq").kind == "span" and get_task("faq").train_rows == questions
    assert get_task("faq-answerable").answerability and get_task("faq-answerable").label_names == (
        "answerable",
        "no_answer",
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda b: b.update(mrpc=b.pop("score")),
            "tasks.mrpc: mrpc is a registered task; give your own task another name",
        ),
        (lambda b: b["score"]["files"].update(train="nope.csv"), "tasks.score.files.train: nope.csv: no such file"),
        # a missing dev or test file is found when the workflow is parsed: else a job kept its old output silently
        (lambda b: b["score"]["files"].update(dev="nope.csv"), "tasks.score.files.dev: nope.csv: no such file"),
        (lambda b: b["score"]["files"].update(test="gone.csv"), "tasks.score.files.test: gone.csv: no such file"),
        (lambda b: b["score"].pop("label"), "tasks.score: a regression task of your own names its label column(s)"),
        (lambda b: b.update({"My Task": b.pop("score")}), "tasks: 'My Task' does not match"),
        (lambda b: b["similarity"].update(labels=["low", "mid"]), "similarity-train.csv: line "),
        (lambda b: b["paraphrase"].update(metrics=["bleu"]), "tasks.paraphrase.metrics: 'bleu' not a classification"),
        # a label metric on real-valued scores, or a correlation of label ids: refused by kind
        (lambda b: b["score"].update(metrics=["accuracy"]), "tasks.score.metrics: 'accuracy' not a regression metric"),
        (lambda b: b["paraphrase"].update(metrics=["pearson"]), "tasks.paraphrase.metrics: 'pearson' not a classif"),
        (lambda b: b.update(qqp2={"train_size": 3}), "tasks: unknown task 'qqp2'"),
        (
            lambda b: b["score"].update(text=["a", "b", "c"]),
            "tasks.score.text: ['a', 'b', 'c'] is not one of the forms this key takes: A classification or regression "
            "task of your own: its text column, or two for a pair task.",
        ),
        (lambda b: b["faq"]["files"].update(test="faq-test.json"), "tasks.faq.files.test: predictions for an "),
        (
            lambda b: b["score"].update(text="score"),
            "tasks.score.text: column 'score' is also the label column; the model would read its answer",
        ),
        # YAML's bare no: a boolean, where a label is text
        (
            lambda b: b["paraphrase"].update(labels=[False, "yes"]),
            "tasks.paraphrase.labels.0: False is not a string: YAML reads a bare yes, no, on, off, true or false as "
            "a boolean; quote it as written ('no', 'off' or 'false')",
        ),
        # a key the task's kind does not read
        (
            lambda b: b["score"].update(labels=["low", "high"]),
            "tasks.score.labels: a regression task takes no labels; only classification tasks do",
        ),
        (
            lambda b: b["faq"].update(text="question"),
            "tasks.faq.text: a span task takes no text; only classification and regression tasks do",
        ),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_key(tiny_bert, tmp_path, change, message):
    from bertvision.errors import BertvisionError

    blocks = write_own_files(tmp_path / "data")
    change(blocks)
    if "line " in message:  # a dev or train label outside the declared set: found when the task is read
        from bertvision.stages.download import download_task

        settings = own_settings(own_config(tiny_bert, blocks))
        with pytest.raises(BertvisionError, match=message):
            download_task(get_task("similarity"), settings.download("similarity"), tmp_path / "raw")
        assert not (tmp_path / "raw").exists()
        return
    with pytest.raises(BertvisionError) as err:
        own_settings(own_config(tiny_bert, blocks))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


def test_validate_config_reads_every_row_of_every_declared_file_before_anything_runs(tiny_bert, tmp_path):
    """The workflow's parse reads a train file's rows and labels only; `bertvision validate-config`
    reads every declared file as the download will and names the key, file, line and column."""
    from bertvision.config.validate import validate_config_file
    from bertvision.errors import ConfigError

    blocks = write_own_files(tmp_path / "data")
    config = tmp_path / "own.yaml"

    def problem(change) -> str:
        changed = yaml.safe_load(yaml.safe_dump(blocks))
        change(changed)
        config.write_text(yaml.safe_dump(own_config(tiny_bert, changed)))
        with pytest.raises(ConfigError) as err:
            validate_config_file([config])
        assert len(str(err.value).splitlines()) == 1, err.value
        return str(err.value)

    config.write_text(yaml.safe_dump(own_config(tiny_bert, blocks)))
    validate_config_file([config])  # the rows as written pass
    assert problem(lambda b: b["paraphrase"].update(text=["a", "bb"])) == (
        f"{config}: tasks.paraphrase.files.train: {blocks['paraphrase']['files']['train']}: missing column(s) "
        "['bb']; columns found: ['a', 'b', 'same']"
    )
    assert problem(lambda b: b["score"]["files"].update(test="gone.parquet")) == (
        f"{config}: tasks.score.files.test: gone.parquet: no such file (relative to the working directory {Path.cwd()})"
    )
    assert problem(lambda b: b["faq"]["files"].update(dev=b["similarity"]["files"]["dev"])).startswith(
        f"{config}: tasks.faq.files.dev: "
    )
    # a column the predictions would overwrite: found by the predict job, the run's last (own-task.md: refused)
    test = pd.read_csv(blocks["similarity"]["files"]["test"], keep_default_na=False)
    test.assign(probability_high="x").to_csv(tmp_path / "taken.csv", index=False)
    assert problem(lambda b: b["similarity"]["files"].update(test=str(tmp_path / "taken.csv"))) == (
        f"{config}: tasks.similarity.files.test: {tmp_path / 'taken.csv'}: column 'probability_high' is where the "
        "predictions go; rename it in the file"
    )
    dev = pd.read_csv(blocks["similarity"]["files"]["dev"], keep_default_na=False)
    dev.loc[4, "band"] = "very high"
    dev.to_csv(blocks["similarity"]["files"]["dev"], index=False)
    message = problem(lambda b: None)
    assert message.startswith(f"{config}: tasks.similarity.files.dev: {blocks['similarity']['files']['dev']}: line ")
    assert message.endswith("column 'band': unknown label 'very high' in dev; expected one of " + str(list(BANDS)))


def test_validate_config_notes_dev_rows_that_repeat_a_train_rows_texts(tiny_bert, tmp_path, capsys):
    """Valid, and said: a dev row whose texts are a train row's rewards memory (counted exactly)."""
    from bertvision.config.validate import validate_config_file

    blocks = write_own_files(tmp_path / "data")
    config = tmp_path / "own.yaml"
    config.write_text(yaml.safe_dump(own_config(tiny_bert, blocks)))
    validate_config_file([config])
    notes = capsys.readouterr().out.splitlines()[1:]
    # STS-B's own dev repeats train pairs (6 of its 1,500; 2 among the first 30), and single sentences
    # more often; MRPC's share none
    assert [n.split(": ")[2:4] for n in notes] == [
        ["tasks.score.files.dev", "4 of 30 dev rows repeat a train row's text exactly; a model that remembers"
         " train scores well on them (dev is scored as given)"],
        ["tasks.similarity.files.dev", "2 of 30 dev rows repeat a train row's text exactly; a model that remembers"
         " train scores well on them (dev is scored as given)"],
    ]  # fmt: skip
    files = blocks["paraphrase"]["files"]
    train, dev = (pd.read_json(files[split], lines=True) for split in ("train", "dev"))
    dev.loc[[1, 3], ["a", "b"]] = train.loc[[0, 5], ["a", "b"]].to_numpy()
    dev.loc[6, "a"] = train.loc[2, "a"]  # one text of a pair: not a repeat
    dev.to_json(files["dev"], orient="records", lines=True)
    validate_config_file([config])
    assert [n for n in capsys.readouterr().out.splitlines() if "tasks.paraphrase" in n] == [
        f"{config}: note: tasks.paraphrase.files.dev: 2 of {len(dev)} dev rows repeat a train row's text exactly; "
        "a model that remembers train scores well on them (dev is scored as given)"
    ]
    # a declared label that no train row has: valid, and said (a model may predict it, none learns it)
    blocks["paraphrase"].update(labels=[0, 1, 2], label_meanings=[*PAIR_MEANINGS, "unseen"])
    config.write_text(yaml.safe_dump(own_config(tiny_bert, blocks)))
    validate_config_file([config])
    assert f"{config}: note: tasks.paraphrase.labels: label(s) ['2'] have no train row: no model learns them, though " \
        "each may predict them" in capsys.readouterr().out.splitlines()  # fmt: skip


def test_a_bad_row_stops_the_download_job_in_one_line_and_writes_nothing(tiny_bert, tmp_path):
    """The job's own process knows the declared task from the environment the workflow gives it
    (rules/common.smk), reads the dev file and names its bad label's line."""
    import os
    import subprocess
    import sys

    from bertvision.registry.tasks import DECLARED_ENV, declared_json

    blocks = write_own_files(tmp_path / "data")
    dev = pd.read_csv(blocks["similarity"]["files"]["dev"], keep_default_na=False)
    dev.loc[4, "band"] = "very high"
    dev.to_csv(blocks["similarity"]["files"]["dev"], index=False)
    settings = own_settings(own_config(tiny_bert, blocks))
    env = {**os.environ, DECLARED_ENV: declared_json(settings.declared)}
    out = tmp_path / "raw" / "similarity"
    proc = subprocess.run(
        [sys.executable, "-m", "bertvision", "download", "--task", "similarity", "--settings",
         settings.download("similarity").to_json(), "--out-dir", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if ": error: " in x]
    assert "similarity-dev.csv: line " in line and "column 'band': unknown label 'very high'" in line
    assert not out.exists()


def test_a_bad_unlabelled_row_stops_the_download_before_anything_is_written(tiny_bert, tmp_path):
    from bertvision.errors import DataFormatError
    from bertvision.stages.download import download_task

    blocks = write_own_files(tmp_path / "data")
    unlabelled = pd.read_csv(blocks["similarity"]["files"]["test"], keep_default_na=False)
    unlabelled.loc[7, "second, sentence"] = " "
    unlabelled.to_csv(blocks["similarity"]["files"]["test"], index=False)
    settings = own_settings(own_config(tiny_bert, blocks))
    out = tmp_path / "raw" / "similarity"
    with pytest.raises(DataFormatError) as err:
        download_task(get_task("similarity"), settings.download("similarity"), out)
    assert "similarity-test.csv: line " in str(err.value) and "column 'second, sentence': empty" in str(err.value)
    assert len(str(err.value).splitlines()) == 1 and not out.exists()


def test_an_unlabelled_file_is_read_whole_and_never_scored(tiny_bert, tmp_path):
    """The predict job reads it (``read_unlabelled``); the download only checks it: no split, and no
    job after the download, follows from it."""
    from bertvision.data.task_files import read_unlabelled
    from bertvision.stages.download import download_task

    blocks = write_own_files(tmp_path / "data")
    settings = own_settings(own_config(tiny_bert, blocks))
    out = tmp_path / "raw" / "similarity"
    counts = download_task(get_task("similarity"), settings.download("similarity"), out)
    assert "test" not in counts and not (out / "test.parquet").exists()
    _, unlabelled = read_unlabelled(get_task("similarity"))
    assert len(unlabelled) == 20 and "label" not in unlabelled.columns
    assert get_task("similarity").eval_splits == ("dev",)  # reported splits: dev only


@pytest.mark.slow
def test_a_new_unlabelled_file_reruns_its_predictions_alone(own_run):
    """Rows added to the unlabelled file rerun the predict job only (it reran the task's every job,
    fine-tuning included, when the download read it)."""
    import os

    workdir, blocks = own_run
    unlabelled = Path(blocks["score"]["files"]["test"])
    given, before = unlabelled.read_bytes(), unlabelled.stat()
    rows = pd.read_parquet(unlabelled)
    pd.concat([rows, rows.head(1)], ignore_index=True).to_parquet(unlabelled)
    try:
        assert job_counts(snakemake(workdir, "-n").stdout) == {"predict": 1, "all": 1}
    finally:  # the module's run as it was, for the tests after this one
        unlabelled.write_bytes(given)
        os.utime(unlabelled, (before.st_atime, before.st_mtime))


def test_a_head_applied_across_tasks_answers_in_the_target_tasks_label_order():
    """Heads applied to a task with the same meanings in another order (cross-task transfer):
    each output of the target's label id is the source head's output for that meaning."""
    import dataclasses

    import torch

    from bertvision.stages.head_transfer import RelabeledHead

    base = get_task("sst2")
    source = dataclasses.replace(base, name="a", label_meanings=("bad", "fine", "good"))
    target = dataclasses.replace(base, name="b", label_meanings=("good", "bad", "fine"))
    assert target.shares_labels_with(source) and target.label_order_from(source) == [2, 0, 1]
    head, x = torch.nn.Linear(4, 3), torch.randn(5, 4)
    relabeled = RelabeledHead(head, source=source, target=target)
    torch.testing.assert_close(relabeled(x), head(x)[:, [2, 0, 1]])
    assert not target.shares_labels_with(dataclasses.replace(source, label_meanings=("bad", "fine", "great")))
