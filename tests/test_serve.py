"""``bertvision serve``: a real little run (MRPC with token features, STS-B, SQuAD 2.0 spans and
answerability, all on one
shared encoder checkpoint, tiny random BERT), bundled and served by a real uvicorn server on
loopback. The service's answers are the pipeline's answers (each head's eval_predictions);
bad input is a 4xx naming the field; concurrent requests share encoder passes."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import logging
import shutil
import socket
import struct
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.files import read_json
from bertvision.layout import BERT_LOGITS, HEAD_METRICS, HEAD_PREDICTIONS, Checkpoint, head_run_dir, head_runs
from bertvision.models.head_io import load_head
from bertvision.registry.heads import head_reads
from bertvision.registry.tasks import get_task
from bertvision.serving.bundle import BundleError, bundle_paths, load_bundle
from bertvision.serving.bundle_writer import write_bundle
from tests.conftest import squad_slice, workflow_settings
from tests.http_server import Server
from tests.rounding import (
    apart_rounding_bound,
    assert_close_within_rounding,
    float32_states,
    rounding_bound,
    span_tolerances,
)
from tests.stages import extract_and_train, fine_tune

TASKS = ("mrpc", "stsb", "rte", "squad2", "squad2-answerable")
MAX_TEXTS = 32
MAX_BODY = 64_000
MAX_CHARS = 3_000


def run_settings(tiny_bert):
    """The little run's settings (every fixture that trains on its data builds from these)."""
    sizes = {"train_size": 60, "selection_size": 16, "eval_size": 24, "max_length": 64}
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={
            "mrpc": {**sizes, "token_features": True, "heads": ["lp", "lpm", "tok", "lad"]},
            "stsb": {**sizes, "heads": ["lp", "ad8", "lpm"]},
            # each text encoded alone (a bi-encoder's way); the heads read both sides per layer
            # the pair as one sequence (lp) and each text encoded alone (lpa, cos)
            "rte": {**sizes, "heads": ["lp", "lpa", "cos"]},
            "squad2": squad_slice(40, 16, 16, max_length=96, doc_stride=32, heads=["lp"]),
            # the same questions' answerability: one label per question from its windows
            "squad2-answerable": squad_slice(
                40, 16, 16, max_length=96, doc_stride=32, token_features=True, heads=["lp", "tok"]
            ),
        },
        finetune={"epoch_fractions": [0, 1], "settings": {"batch_size": 16}, "device": "cpu", "precision": "fp32"},
        extract={"precision": "fp32", "device": "cpu", "batch_size": 8},
        heads={
            "models": {
                "lp": {"type": "lp"},
                "lpm": {"type": "lp", "reads": "mean"},
                "lpa": {"type": "lp", "reads": "mean", "pair": "apart"},
                "cos": {"type": "cosine", "reads": "mean"},
                "ad8": {"type": "adapter", "width": 8},
                "tok": {"type": "token-pool"},
                "lad": {"type": "ladder", "reduction": 4, "attention_heads": 2},
            },
            "seeds": [1, 2],
            "device": "cpu",
            "training": {"max_epochs": 2},
        },
    )


@pytest.fixture(scope="module")
def run(tiny_bert, tmp_path_factory):
    """Download, tokenize, fine-tune MRPC (checkpoints 0 and 1), extract all four tasks from
    MRPC's checkpoint 1 (the shared encoder), train each task's heads x two seeds."""
    from bertvision.stages.download import download_task
    from bertvision.stages.tokenize import tokenize_task

    root = tmp_path_factory.mktemp("serve-run")
    settings = run_settings(tiny_bert)
    for task in TASKS:
        download_task(get_task(task), settings.download(task), root / "raw" / task)
        tokenize_task(get_task(task), settings.tokenize("tiny", task), root / "raw" / task, root / "tokens" / task)
    fine_tune(settings, "tiny", "mrpc", root, root / "ft")
    for task in TASKS:
        # MRPC's heads read its own checkpoint: their head + BERT ensembles are scored too
        bert_logits = root / "ft" / "ckpt-1" / BERT_LOGITS if task == "mrpc" else None
        extract_and_train(settings, "tiny", task, root, root / "ft" / "ckpt-1", root, bert_logits)
    return root


def bundle_tasks(root) -> dict:
    return {
        "mrpc": {"heads_dirs": [root / "heads" / "mrpc"], "max_length": 64},
        "stsb": {"heads_dirs": [root / "heads" / "stsb"], "max_length": 64},
        "rte": {"heads_dirs": [root / "heads" / "rte"], "max_length": 64},
        "squad2": {"heads_dirs": [root / "heads" / "squad2"], "max_length": 96, "doc_stride": 32},
        "squad2-answerable": {
            "heads_dirs": [root / "heads" / "squad2-answerable"],
            "max_length": 96,
            "doc_stride": 32,
        },
    }


@pytest.fixture(scope="module")
def bundle(run, tiny_bert):
    return write_bundle(
        run / "bundle",
        run / "ft" / "ckpt-1",
        str(tiny_bert),
        bundle_tasks(run),
        {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1},
        "fp32",
    )


@pytest.fixture(scope="module")
def server(bundle):
    from bertvision.serving.app import ServeSettings, create_app

    settings = ServeSettings(
        max_batch_size=64,
        max_wait_ms=100,
        max_texts=MAX_TEXTS,
        max_body_bytes=MAX_BODY,
        max_text_chars=MAX_CHARS,
        device="cpu",
    )
    with Server(create_app(bundle.root, settings)) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        running.client = client
        yield running


def post(server, body) -> httpx.Response:
    return server.client.post("/predict", json=body)


def kept_run(bundle, task: str, head: str):
    return head_run_dir(bundle.root.parent / "heads" / task, head, bundle.tasks[task].heads[head].seed)


# --- the bundle ----------------------------------------------------------------------------------
def test_bundle_keeps_each_heads_best_seed_and_picks_the_best_mean(run, bundle):
    meta = read_json(bundle.root / "bundle.json")
    assert meta["format"] == 1 and meta["precision"] == "fp32" and (meta["layers"], meta["hidden"]) == (3, 32)
    assert meta["keys"]["encoder"] == "ft1/ckpt-1"
    for task in TASKS:
        spec = get_task(task)
        records = [read_json(r / HEAD_METRICS) for r in head_runs(run / "heads" / task)]
        means = {}
        for head in {r["head"] for r in records}:
            mine = sorted((r for r in records if r["head"] == head), key=lambda r: r["seed"])
            scores = [spec.primary_score(r["metrics"], "selection") for r in mine]
            best = mine[int(np.argmax(scores))]  # argmax: the first (lower seed) of ties
            entry = meta["tasks"][task]["heads"][head]
            assert entry["seed"] == best["seed"] and entry["parameters"] == best["parameters"]
            assert entry["eval_metrics"]["dev"] == best["metrics"]["dev"]
            kept = bundle.root / "heads" / task / head
            assert (kept / "head.safetensors").read_bytes() == (
                head_run_dir(run / "heads" / task, head, best["seed"]) / "head.safetensors"
            ).read_bytes()
            means[head] = (-float(np.mean(scores)), best["parameters"], head)
        assert meta["tasks"][task]["picked"] == min(means, key=means.get)
    assert meta["tasks"]["mrpc"]["feature_level"] == "tokens" and meta["tasks"]["stsb"]["feature_level"] == "cls"
    assert meta["tasks"]["squad2"]["heads"]["lp"]["null_threshold"] is not None
    assert sorted(p.name for p in (bundle.root / "encoder").iterdir() if p.suffix in (".bin", ".pt", ".pkl")) == []


def test_a_pickle_only_encoder_is_refused_naming_the_folder(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    (copy / "encoder" / "model.safetensors").unlink()
    (copy / "encoder" / "pytorch_model.bin").write_bytes(b"not loaded, ever")
    with pytest.raises(
        BundleError,
        match=rf"{copy / 'encoder'}: .*only pickle weights \(pytorch_model.bin\).*"
        "safetensors only",
    ):
        load_bundle(copy)
    with pytest.raises(BundleError, match="safetensors only"):  # nor is one bundled from such a checkpoint
        write_bundle(
            tmp_path / "b2", copy / "encoder", str(copy / "encoder"), bundle_tasks(bundle.root.parent), {}, "fp32"
        )
    assert not (tmp_path / "b2").exists() and not (tmp_path / ".b2.tmp").exists()


def test_a_missing_file_is_named(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    (copy / "heads" / "stsb" / "lp" / "head.safetensors").unlink()
    with pytest.raises(BundleError, match=r"heads/stsb/lp/head.safetensors: missing from the bundle"):
        load_bundle(copy)
    for gone in ("heads/mrpc/lp/metrics.json", "encoder/tokenizer.json", "bundle.json"):
        (copy / gone).unlink()
        with pytest.raises(BundleError, match=rf"{gone}: missing from the bundle"):
            load_bundle(copy)
        if gone != "bundle.json":
            shutil.copy(bundle.root / gone, copy / gone)


def test_an_answer_from_extreme_outputs_is_json(bundle):
    """Logits far apart give probabilities 1 and 0 (exp of 1000 overflows unless shifted by the
    largest); an output that is not finite is null, never inf or nan, which JSON has not."""
    from bertvision.serving.answers import example_result

    mrpc, stsb = bundle.tasks["mrpc"], bundle.tasks["stsb"]
    result = example_result(mrpc, "lp", np.array([1000.0, 0.0], dtype=np.float32))
    assert list(result.probabilities.values()) == [1.0, 0.0] and result.label_id == 0
    score = example_result(stsb, "lp", np.array([np.inf], dtype=np.float32))
    assert score.score is None and score.outputs == [None]
    json.dumps(dataclasses.asdict(score), allow_nan=False)


def test_a_span_at_its_heads_null_threshold_is_no_answer(bundle):
    """As the evaluation cuts (``apply_threshold``: answered above the threshold): a span scoring
    exactly the threshold is abstained on, its has_answer false with it."""
    from bertvision.serving.answers import span_answer

    offsets = np.array([[0, 0], [0, 3], [4, 7], [8, 11]])  # [CLS], then "the cat sat"
    logits = np.array([0.0, 0.0, 3.0, 0.0])
    window = (logits, logits, offsets)  # the best span "cat" scores 6 over the null's 0
    squad = bundle.tasks["squad2"]
    for threshold, answer in ((6.0, ""), (5.5, "cat")):
        head = dataclasses.replace(squad.heads["lp"], null_threshold=threshold)
        task = dataclasses.replace(squad, heads={**squad.heads, "lp": head})
        result = span_answer(task, "lp", "the cat sat", [window])
        assert (result.answer, result.has_answer, result.best_span) == (answer, bool(answer), "cat")
        assert result.score_diff == 6.0


def test_a_bundle_is_written_from_each_trained_head_once_and_of_its_own_task(run, tiny_bert, tmp_path):
    def written(tasks):
        return write_bundle(tmp_path / "b", run / "ft" / "ckpt-1", str(tiny_bert), tasks, {}, "fp32")

    twice = {"mrpc": {"heads_dirs": [run / "heads" / "mrpc"] * 2, "max_length": 64}}
    with pytest.raises(BundleError, match=r"mrpc: head \w+ seed \d is in both .*; give each trained head once"):
        written(twice)
    other = {"mrpc": {"heads_dirs": [run / "heads" / "stsb"], "max_length": 64}}
    with pytest.raises(BundleError, match=r"metrics.json: a head of task 'stsb', given for mrpc"):
        written(other)
    assert not (tmp_path / "b").exists()


def _first_head(index: dict, task: str) -> str:
    return next(iter(index["tasks"][task]["heads"]))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda i: i["tasks"]["stsb"].update(picked="nope"), r"tasks.stsb: picked head 'nope' is not among its heads"),
        (lambda i: i["tasks"]["stsb"].update(heads={}), r"tasks.stsb: no heads"),
        (lambda i: i["tasks"]["stsb"].update(kind="ranking"), r"tasks.stsb: kind 'ranking'"),
        (lambda i: i["tasks"]["mrpc"].update(label_names=["same"]), r"a classification task without label_names"),
        (lambda i: i["tasks"]["stsb"].update(doc_stride=32), r"tasks.stsb: a regression task over context windows$"),
        (
            lambda i: i["tasks"]["squad2-answerable"].update(label_names=["yes", "no", "maybe"]),
            r"tasks.squad2-answerable: a windowed classification task has two labels",
        ),
        (lambda i: i["tasks"]["squad2"].update(doc_stride=None), r"a span task needs doc_stride, n_best and max"),
        (
            lambda i: i["tasks"]["squad2"]["heads"][_first_head(i, "squad2")].update(null_threshold=None),
            r"tasks.squad2: a span head without null_threshold",
        ),
        (
            lambda i: i["tasks"]["mrpc"]["heads"][_first_head(i, "mrpc")].update(ensemble={"head": "x", "how": "mean"}),
            r"an ensemble of a head the task does not have",
        ),
        (
            lambda i: i["tasks"]["stsb"]["heads"][_first_head(i, "stsb")].update(seed=7, seeds=[1, 2]),
            r"tasks.stsb.heads.\w+: seed 7 is not among the seeds trained \(\[1, 2\]\)$",
        ),
        (lambda i: i.update(format=99), r"bundle.json: format 99, this version reads format"),
        (lambda i: i.update(precision="fp8"), r"bundle.json: precision 'fp8', expected one of"),
        (lambda i: i.update(backend="tensorrt"), r"bundle.json: backend 'tensorrt', expected one of"),
        (lambda i: i.update(tasks={}), r"bundle.json: no tasks$"),
        (lambda i: i.update(task_model="mrpc"), r"task_model 'mrpc': a bundle with the task model has that one task"),
        (
            lambda i: i["tasks"]["mrpc"]["heads"][_first_head(i, "mrpc")].update(
                ensemble={"head": _first_head(i, "mrpc"), "how": "mean"}
            ),
            r"bundle.json: ensemble heads need the task's model \(task_model\)$",
        ),
    ],
)
def test_a_bundle_index_edited_out_of_shape_is_refused_naming_what(bundle, tmp_path, edit, message):
    """Each check of a bundle's index, met with the one thing it refuses (a bundle.json edited by
    hand, or written by another bertvision): a BundleError naming the file and what is wrong."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    index = json.loads((copy / "bundle.json").read_text())
    edit(index)
    (copy / "bundle.json").write_text(json.dumps(index))
    with pytest.raises(BundleError, match=message):
        load_bundle(copy)


def test_a_bundle_path_that_is_not_there_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(BundleError, match=f"^{missing}: no such bundle directory$"):
        load_bundle(bundle_paths([missing])[0])


def test_a_directory_with_a_bundle_index_and_a_set_index_is_read_as_the_bundle(bundle, tmp_path):
    """A bundle directory that also holds a bundles.json (a set index left beside it) is that
    bundle, not the set the stray index lists."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    (copy / "bundles.json").write_text(json.dumps({"bundles": {"other": {"path": "elsewhere"}}}))
    assert bundle_paths([copy]) == [copy]
    assert set(load_bundle(bundle_paths([copy])[0]).tasks) == set(bundle.tasks)


def test_a_bundle_that_would_serve_an_ensemble_beside_other_tasks_is_refused_before_it_is_written(
    run, tiny_bert, tmp_path
):
    tasks = bundle_tasks(run)
    tasks = {"mrpc": {**tasks["mrpc"], "ensemble": {"head": "lp", "how": "mean"}}, "stsb": tasks["stsb"]}
    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    out = tmp_path / "bundle"
    with pytest.raises(BundleError, match=r"^mrpc: a head \+ BERT ensemble is served from a bundle of its task alone$"):
        write_bundle(out, run / "ft" / "ckpt-1", str(tiny_bert), tasks, meta, "fp32")
    assert not out.exists()


def test_an_ensemble_of_a_head_that_reads_a_pair_apart_is_refused(run, tiny_bert, tmp_path):
    """BERT reads a pair as one sequence: its outputs are not combined with a head reading each text alone."""
    tasks = {"rte": {**bundle_tasks(run)["rte"], "ensemble": {"head": "lpa", "how": "mean"}}}
    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    out = tmp_path / "bundle"
    with pytest.raises(
        BundleError, match=r"^rte: a head \+ BERT ensemble is not served for a head that reads a pair apart"
    ):
        write_bundle(out, run / "ft" / "ckpt-1", str(tiny_bert), tasks, meta, "fp32")
    assert not out.exists()


def test_a_head_type_this_bertvision_lacks_is_named_in_one_line(bundle, tmp_path, capsys):
    """A bundle made where a head type of one's own is registered, served by a bertvision without it."""
    from bertvision.commands.main import main

    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    index = json.loads((copy / "bundle.json").read_text())
    index["tasks"]["stsb"]["heads"]["lp"]["spec"]["type"] = "layer-attn"
    (copy / "bundle.json").write_text(json.dumps(index))
    assert main(["serve", str(copy), "--port", "1"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "tasks.stsb: head lp: type 'layer-attn' is not one this bertvision has" in errors[0]


# --- the service's answers are the pipeline's --------------------------------------------------
# The service encodes a request in one batch (or chunks of it), the pipeline in length-sorted
# batches of 8: the answers agree to float32 error plus what float16 rounding of the states can
# add (tests/rounding.py), and a near tie may fall either way within that.
def dev_rows(run, task: str) -> pd.DataFrame:
    return pd.read_parquet(run / "raw" / task / "dev.parquet")


def bundle_head(bundle, task: str, head: str):
    entry = bundle.tasks[task]
    return load_head(entry.heads[head].dir, bundle.layers, entry.heads[head].state_width(bundle.hidden), entry.outputs)


def rounding_bounds(run, bundle, task: str, head: str, texts_of: str, idx) -> np.ndarray:
    """(rows, outputs): how far float16 rounding can move ``task``'s ``head`` on the dev texts
    of ``texts_of`` with these ``idx`` (both tasks tokenize at max_length 64)."""
    tokens = run / "tokens" / texts_of / "dev.parquet"
    entry = bundle.tasks[task].heads[head]
    reads = head_reads(entry.spec)
    if entry.pair == "apart":
        bound = apart_rounding_bound(bundle_head(bundle, task, head), bundle.encoder_dir, tokens.parent, "dev", reads)
    else:
        states = float32_states(bundle.encoder_dir, tokens, reads)
        bound = rounding_bound(bundle_head(bundle, task, head), *states, exact_first_layer=reads != "mean")
    position = {int(i): k for k, i in enumerate(pd.read_parquet(tokens, columns=["idx"])["idx"])}
    return bound[[position[int(i)] for i in idx]]


def same_label_or_near_tie(got_label: str, want_label: str, want_outputs, bound) -> bool:
    """The same label, or two logits closer than their rounding bounds (and float32 error)."""
    top = np.sort(np.asarray(want_outputs, dtype=np.float64))[-2:]
    return got_label == want_label or top[1] - top[0] < float(np.sum(bound)) + 1e-5


def ask_texts(server, task: str, head: str, rows: pd.DataFrame) -> list[dict]:
    fields = get_task(task).text_fields
    answers = []
    for start in range(0, len(rows), MAX_TEXTS):
        chunk = rows.iloc[start : start + MAX_TEXTS]
        texts = [list(r) for r in zip(*(chunk[f] for f in fields))] if len(fields) == 2 else list(chunk[fields[0]])
        response = post(server, {"texts": texts, "tasks": [task], "heads": {task: head}})
        assert response.status_code == 200, response.text
        answers += [p[task] for p in response.json()["predictions"]]
    return answers


@pytest.mark.parametrize(
    "task, head",
    [
        ("mrpc", "lp"),
        ("mrpc", "lpm"),
        ("mrpc", "tok"),
        ("mrpc", "lad"),
        ("stsb", "lp"),
        ("stsb", "ad8"),
        ("stsb", "lpm"),
        ("rte", "lp"),
        ("rte", "lpa"),
        ("rte", "cos"),
    ],
)
def test_example_answers_equal_the_pipelines_predictions(run, bundle, server, task, head):
    rows = dev_rows(run, task)
    expected = pd.read_parquet(kept_run(bundle, task, head) / HEAD_PREDICTIONS).set_index("idx").loc[rows["idx"]]
    answers = ask_texts(server, task, head, rows)
    assert len(answers) == len(rows) == len(expected)
    bound = rounding_bounds(run, bundle, task, head, task, rows["idx"])
    outputs = np.array([a["outputs"] for a in answers])
    want = np.stack(expected["outputs"].to_numpy())
    assert_close_within_rounding(outputs, want, bound, rtol=1e-4, atol=1e-4, what=f"{task} {head}")
    assert all(a["head"] == head for a in answers)
    if task == "stsb":
        scores = [a["score"] for a in answers]
        assert_close_within_rounding(scores, expected["prediction"], bound[:, 0], rtol=1e-4, atol=1e-4, what="scores")
        return
    names = get_task(task).label_names
    for answer, label, logits, moves in zip(answers, expected["prediction"], want, bound):
        assert same_label_or_near_tie(answer["label"], names[label], logits, moves)  # a near tie may fall either way
        assert answer["label_id"] == names.index(answer["label"])
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0)


def test_span_answers_equal_the_pipelines_predictions(run, bundle, server):
    rows = dev_rows(run, "squad2")
    expected = pd.read_parquet(kept_run(bundle, "squad2", "lp") / HEAD_PREDICTIONS)
    expected = expected[expected["split"] == "dev"].set_index("id").loc[rows["id"]]
    response = post(server, {"qa": [{"question": q, "context": c} for q, c in zip(rows["question"], rows["context"])]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["predictions"] == [] and len(body["answers"]) == len(rows)
    threshold = bundle.tasks["squad2"].heads["lp"].null_threshold
    tolerances = span_tolerances(
        bundle_head(bundle, "squad2", "lp"),
        bundle.encoder_dir,
        run / "tokens" / "squad2" / "dev.parquet",
        list(rows["context"]),
        bundle.tasks["squad2"].max_answer_length,
        atol=1e-4,
    )
    answers = (a["squad2"] for a in body["answers"])
    for answer, (_, want), (tolerance, near_best) in zip(answers, expected.iterrows(), tolerances):
        # the same best span, or a near tie of the stored states' logits within the rounding bounds
        assert answer["best_span"] == want["best_span"] or {answer["best_span"], want["best_span"]} <= near_best
        assert answer["score_diff"] == pytest.approx(want["score_diff"], abs=tolerance)
        if abs(want["score_diff"] - threshold) > tolerance:  # not on the threshold: the same decision
            assert answer["has_answer"] == (want["prediction"] != "")
            assert answer["answer"] == (answer["best_span"] if answer["has_answer"] else "")
            assert answer["answer"] == want["prediction"] or answer["best_span"] != want["best_span"]
        assert answer["null_threshold"] == threshold


@pytest.mark.parametrize("head", ["lp", "tok"])
def test_answerability_answers_are_the_evaluations_best_window_labels(run, bundle, server, head):
    """A question's served label is what the evaluation scored: its windows' outputs (stored in
    the head's eval_predictions) aggregated by the best window; the served outputs are that
    window's. Scored against the data's labels, the answers give the head's recorded accuracy."""
    from bertvision.registry.metrics import best_window, question_gold

    task = "squad2-answerable"
    rows = dev_rows(run, task)
    windows = pd.read_parquet(kept_run(bundle, task, head) / HEAD_PREDICTIONS)
    windows = windows[windows["split"] == "dev"]
    response = post(
        server,
        {
            "qa": [{"question": q, "context": c} for q, c in zip(rows["question"], rows["context"])],
            "tasks": [task],
            "heads": {task: head},
        },
    )
    assert response.status_code == 200, response.text
    answers = [a[task] for a in response.json()["answers"]]
    assert len(answers) == len(rows) and all(a["head"] == head for a in answers)
    names = get_task(task).label_names
    served = []
    for idx, answer in zip(rows["idx"], answers):
        outputs = np.stack(windows.loc[windows["idx"] == idx, "outputs"].to_numpy())
        margins = outputs[:, 0] - outputs[:, 1]
        want = names[int(best_window(outputs, np.zeros(len(outputs), dtype=np.int64))[0])]
        got_margin = answer["outputs"][0] - answer["outputs"][1]
        assert got_margin == pytest.approx(margins.max(), abs=2e-3)  # float16 states, float32 error
        assert answer["label"] == want or abs(margins.max()) < 2e-3
        assert answer["label_id"] == names.index(answer["label"])
        served.append(answer["label_id"])
    gold = question_gold(rows)
    accuracy = float(np.mean([label == gold[int(i)] for label, i in zip(served, rows["idx"])]))
    recorded = read_json(kept_run(bundle, task, head) / HEAD_METRICS)["metrics"]["dev"]["accuracy"]
    assert accuracy == pytest.approx(recorded, abs=1.5 / len(rows))  # one near tie may fall either way


def test_all_tasks_of_a_text_come_from_one_encoder_pass(server, bundle):
    before = server.client.get("/health").json()["encoder_passes"]
    response = post(
        server,
        {
            "texts": [["A man is playing a guitar.", "A man plays the guitar."]] * 3
            + [["The cat sat.", "Stocks fell."]],
            "qa": [{"question": "Who plays?", "context": "A man plays the guitar in the park."}],
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert server.client.get("/health").json()["encoder_passes"] == before + 1
    for per_text in body["predictions"]:  # default: every task that takes a pair, each with its picked head
        assert list(per_text) == ["mrpc", "rte", "stsb"]  # rte's pairs encoded apart, in the same pass
        assert per_text["mrpc"]["head"] == bundle.tasks["mrpc"].picked and per_text["mrpc"]["label"] is not None
        assert per_text["stsb"]["head"] == bundle.tasks["stsb"].picked and per_text["stsb"]["score"] is not None
    assert body["predictions"][0] == body["predictions"][1] == body["predictions"][2]
    assert list(body["answers"][0]) == ["squad2", "squad2-answerable"]
    assert body["answers"][0]["squad2-answerable"]["label"] in ("answerable", "no_answer")


def test_a_pair_encoded_apart_encodes_each_distinct_text_once_beside_the_joint_pairs(bundle):
    """Two pairs sharing a text, asked of a joint task (mrpc) and a task encoded apart (rte), and
    the shared text alone of no task: the two joint sequences and the three distinct texts, one
    pass; the same pair asked alone gets the same answer."""
    from bertvision.serving.engine import Engine
    from bertvision.serving.items import TextItem

    engine = Engine(bundle, "cpu")
    a, b, c = "A man is playing a guitar.", "A man plays the guitar.", "Stocks fell."
    heads = {"mrpc": "lp", "rte": "cos"}
    together, _ = engine.predict([TextItem((a, b), heads), TextItem((a, c), heads)])
    assert engine.encoder_passes == 1 and engine.sequences_encoded == 5
    alone, _ = engine.predict([TextItem((a, c), {"rte": "cos"})])
    assert engine.sequences_encoded == 5 + 2  # no joint sequence for a head that reads the pair apart
    np.testing.assert_allclose(alone[0]["rte"].outputs, together[1]["rte"].outputs, rtol=1e-4, atol=1e-4)
    # one task, a head of each form: its joint head's pair as one sequence, its cosine's texts alone
    mixed, _ = engine.predict([TextItem((a, b), {"rte": "lp"}), TextItem((a, c), {"rte": "cos"})])
    assert engine.sequences_encoded == 7 + 1 + 2
    np.testing.assert_allclose(mixed[1]["rte"].outputs, together[1]["rte"].outputs, rtol=1e-4, atol=1e-4)


# --- the engine's bookkeeping: each item gets its own answers, in its own order ------------------
@pytest.fixture(scope="module")
def engine(bundle):
    from bertvision.serving.engine import Engine

    return Engine(bundle, "cpu")


def assert_same_answers(got: dict, want: dict) -> None:
    """One item's answers from a mixed batch and from the item asked alone: the same tasks in the
    same order, each from the same head, equal up to what another batch's padding moves."""
    assert list(got) == list(want)
    for task, answer in got.items():
        assert answer.head == want[task].head, task
        if hasattr(answer, "best_span"):
            assert answer.best_span == want[task].best_span, task
            assert answer.score_diff == pytest.approx(want[task].score_diff, rel=1e-4, abs=1e-4), task
        else:
            np.testing.assert_allclose(answer.outputs, want[task].outputs, rtol=1e-4, atol=1e-4, err_msg=task)


def asked_alone(engine, texts=(), questions=()) -> tuple[list, list]:
    """Each item's answers, asked in a batch of its own."""
    return (
        [engine.predict([item])[0][0] for item in texts],
        [engine.predict([], [item])[1][0] for item in questions],
    )


def test_question_tasks_of_two_window_settings_in_one_batch_read_each_its_own_questions(run, tiny_bert, tmp_path):
    """Two question tasks cut into windows of different strides (two window groups), each asked
    by some of a batch's questions: every question is answered from its own windows, as alone."""
    from bertvision.serving.engine import Engine
    from bertvision.serving.items import QuestionItem

    tasks = bundle_tasks(run)
    tasks = {"squad2": tasks["squad2"], "squad2-answerable": {**tasks["squad2-answerable"], "doc_stride": 48}}
    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    engine = Engine(
        write_bundle(tmp_path / "bundle", run / "ft" / "ckpt-1", str(tiny_bert), tasks, meta, "fp32"), "cpu"
    )
    questions = [
        QuestionItem("Who plays?", "A man plays the guitar in the park.", {"squad2": "lp"}),
        QuestionItem("What fell?", "Stocks fell sharply on Monday morning.", {"squad2-answerable": "tok"}),
        QuestionItem(
            "Where sat the cat?", "The cat sat on the mat by the door.", {"squad2": "lp", "squad2-answerable": "lp"}
        ),
        QuestionItem("Who sang?", "A woman sang a song to the crowd.", {"squad2-answerable": "lp"}),
        QuestionItem("What rose?", "Prices rose again in the spring.", {"squad2": "lp"}),
    ]
    _, together = engine.predict([], questions)
    assert engine.encoder_passes == 1
    for got, want in zip(together, asked_alone(engine, questions=questions)[1]):
        assert_same_answers(got, want)


def test_each_item_gets_the_head_it_names_when_a_batch_asks_one_task_with_several_heads(engine):
    """Items naming different heads of one task (per-example, mean-reading and token heads; a
    windowed task's [CLS] and token heads), in one batch: each its own head's answer, as alone."""
    from bertvision.serving.items import QuestionItem, TextItem

    texts = [
        TextItem(tuple(PAIR), {"mrpc": "lp"}),
        TextItem(("The cat sat.", "Stocks fell."), {"mrpc": "lpm"}),
        TextItem(tuple(PAIR), {"mrpc": "tok"}),
        TextItem(("Stocks fell.", "The cat sat."), {"mrpc": "lp"}),
    ]
    questions = [
        QuestionItem("Who plays?", "A man plays the guitar in the park.", {"squad2-answerable": "lp"}),
        QuestionItem("What fell?", "Stocks fell sharply on Monday morning.", {"squad2-answerable": "tok"}),
        QuestionItem("Who plays?", "A man plays the guitar in the park.", {"squad2-answerable": "tok"}),
    ]
    passes = engine.encoder_passes
    together = engine.predict(texts, questions)
    assert engine.encoder_passes == passes + 1
    assert [t["mrpc"].head for t in together[0]] == ["lp", "lpm", "tok", "lp"]
    assert [q["squad2-answerable"].head for q in together[1]] == ["lp", "tok", "tok"]
    for got, want in zip(together[0] + together[1], sum(asked_alone(engine, texts, questions), [])):
        assert_same_answers(got, want)


def test_each_items_answers_come_in_the_order_it_asked_its_tasks(engine):
    from bertvision.serving.items import QuestionItem, TextItem

    texts = [TextItem(tuple(PAIR), {"stsb": "lp", "mrpc": "lp"}), TextItem(tuple(PAIR), {"mrpc": "lp", "stsb": "lp"})]
    question = ("Who plays?", "A man plays the guitar in the park.")
    questions = [
        QuestionItem(*question, {"squad2-answerable": "lp", "squad2": "lp"}),
        QuestionItem(*question, {"squad2": "lp", "squad2-answerable": "lp"}),
    ]
    answers, spans = engine.predict(texts, questions)
    assert [list(a) for a in answers] == [["stsb", "mrpc"], ["mrpc", "stsb"]]
    assert [list(s) for s in spans] == [["squad2-answerable", "squad2"], ["squad2", "squad2-answerable"]]
    assert answers[0]["mrpc"] == answers[1]["mrpc"] and spans[0]["squad2"] == spans[1]["squad2"]


def test_a_text_alone_with_the_ids_of_a_pair_is_not_encoded_as_that_pair(engine):
    """One side of a pair read apart (rte's cos: one text, every token type 0) whose token ids
    are those of another item's pair read joint (mrpc: the second text's token type 1): two
    sequences, each encoded with its own token types, each answer as alone."""
    from bertvision.serving.items import TextItem

    a, b = "A man plays.", "Stocks fell."
    joint = engine.tokenizer(a, b)
    alone = engine.tokenizer(f"{a} [SEP] {b}")
    assert joint["input_ids"] == alone["input_ids"] and joint["token_type_ids"] != alone["token_type_ids"]
    texts = [TextItem((a, b), {"mrpc": "lp"}), TextItem((f"{a} [SEP] {b}", "The cat sat."), {"rte": "cos"})]
    encoded = engine.sequences_encoded
    together, _ = engine.predict(texts)
    encoded = engine.sequences_encoded - encoded
    for got, want in zip(together, asked_alone(engine, texts)[0]):
        assert_same_answers(got, want)
    assert encoded == 3  # the joint pair, and the two texts of the pair read apart


def test_tasks_and_health(server, bundle):
    tasks = server.client.get("/tasks").json()
    assert set(tasks["tasks"]) == set(TASKS) and tasks["encoders"][0]["precision"] == "fp32"
    assert tasks["encoders"][0]["tasks"] == list(bundle.tasks) and {t["encoder"] for t in tasks["tasks"].values()} == {
        0
    }
    mrpc = tasks["tasks"]["mrpc"]
    assert mrpc["kind"] == "classification" and mrpc["label_names"] == ["not_equivalent", "equivalent"]
    assert mrpc["picked"] == bundle.tasks["mrpc"].picked and set(mrpc["heads"]) == {"lp", "lpm", "tok", "lad"}
    assert mrpc["heads"]["lp"]["parameters"] > 0 and "accuracy" in mrpc["heads"]["lp"]["eval_metrics"]["dev"]
    assert "accuracy" in mrpc["heads"]["lp"]["selection_metrics"]
    assert server.client.get("/health").json()["status"] == "ok"
    assert "/predict" in server.client.get("/openapi.json").json()["paths"]
    docs = server.client.get("/docs")
    assert docs.status_code == 200


def test_the_docs_page_loads_every_asset_from_the_service_itself(server):
    """Offline machines (the default setting) render /docs: no CDN, every script, style and icon
    the page names comes from the service."""
    import re

    page = server.client.get("/docs").text
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page)
    assert len(assets) >= 3 and "cdn" not in page and "http://" not in page and "https://" not in page
    for url in assets:
        answer = server.client.get(url)
        assert answer.status_code == 200 and len(answer.content) > 500, url
    assert server.client.get("/openapi.json").status_code == 200


def test_a_batch_cut_into_chunks_gives_the_same_answers(run, bundle):
    from bertvision.serving.engine import Engine
    from bertvision.serving.items import QuestionItem, TextItem

    rows, questions = dev_rows(run, "mrpc"), dev_rows(run, "squad2")
    texts = [TextItem((a, b), {"mrpc": "tok", "stsb": "lp"}) for a, b in zip(rows["sentence1"], rows["sentence2"])]
    asked = [QuestionItem(q, c, {"squad2": "lp"}) for q, c in zip(questions["question"], questions["context"])]
    whole = Engine(bundle, "cpu", max_chunk_rows=0)
    chunked = Engine(bundle, "cpu", max_batch_tokens=300)
    shapes = []
    chunked.encoder.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    (texts_a, spans_a), (texts_b, spans_b) = whole.predict(texts, asked), chunked.predict(texts, asked)
    assert whole.encoder_passes == 1 and chunked.encoder_passes > 5
    # padded to a multiple of pad_multiple, each call within the bound (chunks were cut by the
    # lengths before that padding: 6 rows padded from 50 tokens to 56 made 336)
    assert chunked.pad_multiple > 1 and all(w % chunked.pad_multiple == 0 for _, w in shapes)
    assert max(rows * width for rows, width in shapes) <= 300, shapes
    # The chunks are padded to their own longest sequence, the whole batch to its: the states
    # agree up to float16 rounding (tests/rounding.py), and so do the answers, within its bounds.
    for task, head in (("mrpc", "tok"), ("stsb", "lp")):
        bound = rounding_bounds(run, bundle, task, head, "mrpc", rows["idx"])
        assert_close_within_rounding(
            [a[task].outputs for a in texts_a], [b[task].outputs for b in texts_b], bound, 1e-4, 1e-4, what=task
        )
    tolerances = span_tolerances(
        bundle_head(bundle, "squad2", "lp"),
        bundle.encoder_dir,
        run / "tokens" / "squad2" / "dev.parquet",
        list(questions["context"]),
        bundle.tasks["squad2"].max_answer_length,
        atol=1e-4,
    )
    for a, b, (tolerance, near_best) in zip(spans_a, spans_b, tolerances):
        a, b = a["squad2"], b["squad2"]
        assert a.best_span == b.best_span or {a.best_span, b.best_span} <= near_best
        assert a.score_diff == pytest.approx(b.score_diff, rel=1e-4, abs=tolerance)


# --- bad input: 4xx naming the field, never a 500 ---------------------------------------------------
PAIR = ["A man is playing a guitar.", "A man plays the guitar."]
BAD = [
    ({"texts": [PAIR], "tasks": ["nope"]}, 422, "tasks[0]"),
    ({"texts": ["a single text"], "tasks": ["mrpc"]}, 422, "texts[0]"),  # a pair task given one text
    ({"texts": ["a single text"]}, 422, "texts[0]"),  # no task of this bundle takes one text
    ({"texts": [PAIR, ["a", "b", "c"]]}, 422, "texts[1]"),
    ({"texts": []}, 422, "texts"),
    ({}, 422, "texts"),
    ({"texts": [PAIR], "tasks": []}, 422, "tasks"),
    ({"texts": [PAIR], "tasks": "mrpc"}, 422, "tasks"),
    ({"texts": [7]}, 422, "texts[0]"),
    ({"texts": "just a string"}, 422, "texts"),
    ({"texts": [PAIR] * (MAX_TEXTS + 1)}, 413, "texts"),
    ({"texts": [["x" * (MAX_CHARS + 1), "y"]]}, 413, "texts[0][0]"),
    ({"texts": [PAIR], "heads": {"mrpc": "no-such-head"}}, 422, "heads.mrpc"),
    ({"texts": [PAIR], "tasks": ["mrpc"], "heads": {"stsb": "lp"}}, 422, "heads.stsb"),
    ({"texts": [PAIR], "colour": "blue"}, 422, "colour"),
    ({"tasks": ["squad2"]}, 422, "qa"),  # a span task without question/context
    ({"texts": [PAIR], "tasks": ["squad2"]}, 422, "qa"),
    ({"qa": [{"question": "Who?"}]}, 422, "qa[0].context"),
    ({"qa": [{"context": "Somebody did."}]}, 422, "qa[0].question"),
    ({"qa": [{"question": "  ", "context": "Somebody did."}]}, 422, "qa[0].question"),
    ({"qa": [{"question": "who " * 80, "context": "Somebody did."}]}, 422, "qa[0].question"),  # no room left
    ({"qa": [{"question": "Who?", "context": "word " * 2000}]}, 413, "qa[0].context"),  # too many windows
    ({"qa": [{"question": "Who?", "context": "z" * (MAX_CHARS + 1)}]}, 413, "qa[0].context"),
    ({"qa": [{"question": "Who?", "context": "Somebody."}], "tasks": ["mrpc"]}, 422, "texts"),
    ({"qa": []}, 422, "qa"),
    ({"texts": [PAIR], "heads": {"squad2": "lp"}}, 422, "heads.squad2"),  # a head for a task no input reaches
    # nothing to read (a task's own files refuse it): it was answered as if it were a text
    ({"texts": [["", "b"]]}, 422, "texts[0][0]"),
    ({"texts": [["a", " \n\t"]]}, 422, "texts[0][1]"),
    # characters that tokenize to nothing: zero-width, byte-order mark, NUL, a combining mark alone
    ({"texts": [["\u200b", "b"]]}, 422, "texts[0][0]"),
    ({"texts": [["a", "\ufeff\u0000\x01"]]}, 422, "texts[0][1]"),
    ({"qa": [{"question": "\u0301", "context": "Somebody did."}]}, 422, "qa[0].question"),
    # the replacement character (what a client decoding with errors="replace" sends): BERT's tokenizer drops it
    ({"texts": [["\ufffd\ufffd", "b"]]}, 422, "texts[0][0]"),
    # inputs beside the ones the tasks asked take: they were answered with nothing
    ({"texts": [PAIR], "qa": [{"question": "Who?", "context": "Somebody."}], "tasks": ["squad2"]}, 422, "texts"),
    ({"texts": [PAIR], "qa": [{"question": "Who?", "context": "Somebody."}], "tasks": ["mrpc"]}, 422, "qa"),
    ({"texts": [], "qa": [{"question": "Who?", "context": "Somebody."}]}, 422, "texts"),
]


@pytest.mark.parametrize("body, status, field", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_a_4xx_naming_the_field(server, body, status, field):
    response = post(server, body)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert response.json()["field"] == field and detail.startswith(f"{field}: "), detail


def test_an_unknown_key_is_refused_naming_the_keys_it_may_be(server):
    """A client that sends another API's body (``task``, ``inputs``) learns which keys this one takes."""
    response = post(server, {"task": "mrpc", "inputs": [PAIR]})
    assert response.status_code == 422 and response.json()["errors"] == [
        {"field": key, "message": "not a field here; it takes texts, qa, tasks, heads"} for key in ("task", "inputs")
    ]
    response = post(server, {"qa": [{"question": "Who?", "context": "Jane did.", "answer": "Jane"}]})
    assert response.json()["detail"] == "qa[0].answer: not a field here; it takes question, context"


def test_questions_to_a_bundle_without_a_span_task_are_a_4xx_naming_qa(run, tiny_bert, server):
    """Not an empty 200: a qa item, alone or beside texts, that no task of the bundle answers."""
    from bertvision.serving.app import create_app

    tasks = {k: v for k, v in bundle_tasks(run).items() if not k.startswith("squad2")}
    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    texts_only = write_bundle(run / "bundle-texts", run / "ft" / "ckpt-1", str(tiny_bert), tasks, meta, "fp32")
    question = {"question": "Who sat?", "context": "The cat sat."}
    with Server(create_app(texts_only.root, server.app.state.settings)) as running:
        for body in ({"qa": [question]}, {"texts": [PAIR], "qa": [question]}):
            response = httpx.post(f"{running.url}/predict", json=body, timeout=60)
            assert response.status_code == 422, response.text
            assert response.json()["field"] == "qa" and "no task that answers questions" in response.json()["detail"]
        assert httpx.post(f"{running.url}/predict", json={"texts": [PAIR]}, timeout=60).status_code == 200


def test_texts_to_a_bundle_of_question_tasks_alone_are_a_4xx_naming_the_qa_form(run, tiny_bert, server):
    """The refusal says what the service takes instead, also when none of its tasks takes texts."""
    from bertvision.serving.app import create_app

    tasks = {k: v for k, v in bundle_tasks(run).items() if k.startswith("squad2")}
    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    questions_only = write_bundle(run / "bundle-qa", run / "ft" / "ckpt-1", str(tiny_bert), tasks, meta, "fp32")
    with Server(create_app(questions_only.root, server.app.state.settings)) as running:
        response = httpx.post(f"{running.url}/predict", json={"texts": ["a text"]}, timeout=60)
        assert response.status_code == 422, response.text
        assert response.json()["detail"] == (
            f"texts[0]: no task of this service takes a single text; {', '.join(sorted(tasks))} take(s) qa: "
            "[{question, context}]"
        )


@pytest.mark.parametrize(
    "content, headers, status, field",
    [
        (b"{not json", {}, 422, "body"),
        (b"[1, 2]", {}, 422, "body"),
        (rb'{"texts": [["fine", "a lone \ud800 surrogate"]]}', {}, 422, "texts[0][1]"),
        (rb'{"qa": [{"question": "\udfff?", "context": "Somebody."}]}', {}, 422, "qa[0].question"),
        (b'{"texts": ["' + b"x" * MAX_BODY + b'"]}', {}, 413, "body"),  # by Content-Length
        (b'{"texts": ["caf\xe9"]}', {}, 400, "body"),  # Latin-1, not UTF-8
        (b'{"texts": ' + b"[" * 5000 + b"]" * 5000 + b"}", {}, 400, "body"),  # deeper than a parser goes
        (b'{"texts": ["a", "b"]}', {"content-type": "text/plain"}, 422, "body"),
    ],
)
def test_bad_bodies_are_refused(server, content, headers, status, field):
    response = server.client.post("/predict", content=content, headers={"content-type": "application/json", **headers})
    assert response.status_code == status, response.text
    assert response.json()["field"] == field and response.json()["detail"].startswith(f"{field}: "), response.text
    if b"\xe9" in content:  # it said only that the body could not be parsed
        assert response.json()["detail"].startswith("body: not UTF-8 text (byte 16: "), response.text
    elif status == 400 or headers:  # a body not read as JSON: what the service takes
        assert "a JSON object (content-type: application/json)" in response.json()["detail"], response.text


def test_a_body_that_is_not_json_or_empty_says_where_and_what(server):
    """It said "JSON decode error" with no place, and "Field required" for an empty body; a JSON
    string was "not JSON"; a lone surrogate alone was "empty"."""
    expected = "body: a JSON object (content-type: application/json) with texts and/or qa, not "
    for content, content_type, what in (
        (b'"x"', "application/json", "a JSON string"),
        (b"[1, 2]", "application/json", "a JSON list"),
        (b'{"texts": ["a"]}', "text/plain", "a body sent as text/plain"),
    ):
        response = server.client.post("/predict", content=content, headers={"content-type": content_type})
        assert response.status_code == 422 and response.json()["detail"] == expected + what, response.text
    response = server.client.post(
        "/predict", content=rb'{"texts": ["\ud800"]}', headers={"content-type": "application/json"}
    )
    assert response.json()["detail"] == "texts[0]: not valid Unicode (a lone surrogate)", response.text
    response = server.client.post(
        "/predict", content=b'{"texts": [oops]}', headers={"content-type": "application/json"}
    )
    assert response.json()["detail"] == "body: not JSON (Expecting value at character 11)", response.text
    response = server.client.post("/predict", content=b"", headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"].startswith("body: empty; a JSON object"), (
        response.text
    )


def test_a_lone_surrogate_in_a_key_or_an_echoed_id_is_a_4xx_naming_it(server):
    """JSON may escape a lone surrogate (``"\\ud800"``) where no text check looks: in a heads key
    the refusal naming it could not be encoded (a 500, the connection dropped); as a v2 ``id`` the
    model ran and the answer echoing it could not be encoded (a 500)."""
    response = server.client.post(
        "/predict",
        content=rb'{"texts": [["a", "b"]], "heads": {"\ud800": "lp"}}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "heads.\\ud800", response.text
    assert response.json()["detail"].startswith("heads.\\ud800: unknown task '\\ud800'"), response.text
    pair = rb'[{"name": "text_a", "datatype": "BYTES", "shape": [1], "data": ["a"]}, ' + (
        rb'{"name": "text_b", "datatype": "BYTES", "shape": [1], "data": ["b"]}]'
    )
    response = server.client.post("/v2/models/mrpc/infer", content=rb'{"id": "\ud800", "inputs": ' + pair + b"}")
    assert response.status_code == 400, response.text
    assert response.json() == {"error": "id: not valid Unicode (a lone surrogate)", "field": "id"}
    assert server.client.get("/health").status_code == 200


def test_json_no_parser_reads_says_why_in_each_api(server):
    """Nested 10,000 deep, or an integer of 5,000 digits: the native API said only "there was an
    error parsing the body", the protocol's told the client to call sys.set_int_max_str_digits()."""
    deep, long_number = b"[" * 10_000 + b"]" * 10_000, b"9" * 5000
    native = "body: a JSON object (content-type: application/json) with texts and/or qa; not JSON "
    for path, prefix in (("/predict", native), ("/v2/models/mrpc/infer", "body: not JSON ")):
        for content, why in (
            (b'{"texts": ' + deep + b"}", "(nested too deeply)"),
            (b'{"texts": [' + long_number + b"]}", "(a number of 5000 digits, at most 4300)"),
        ):
            response = server.client.post(path, content=content, headers={"content-type": "application/json"})
            assert response.status_code == 400 and response.json()["field"] == "body", response.text
            assert response.json()["detail" if path == "/predict" else "error"] == prefix + why, response.text


def test_a_wrong_method_or_path_is_refused_naming_what_the_route_takes(server):
    """A method a route does not take said "Method Not Allowed", a path no route has "Not Found",
    naming neither the method nor the path."""
    for method, path, takes in (("GET", "/predict", "POST"), ("POST", "/health", "GET, HEAD"),
                                ("DELETE", "/v2/models/mrpc/infer", "POST")):  # fmt: skip
        response = server.client.request(method, path)
        assert response.status_code == 405, response.text
        key = "error" if path.startswith("/v2") else "detail"
        assert response.json() == {key: f"method: {method} is not taken by {path}; it takes {takes}", "field": "method"}
        assert sorted(m.strip() for m in response.headers["allow"].split(",")) == takes.split(", ")
    response = server.client.get("/v2/repository/index")
    assert response.status_code == 404, response.text
    assert response.json() == {
        "error": "path: no route /v2/repository/index; GET /v2/models lists the models",
        "field": "path",
    }
    response = server.client.post("/predicts", json={})
    assert response.json() == {"detail": "path: no route /predicts; GET /docs lists the routes", "field": "path"}


def test_a_malformed_content_length_is_a_400(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ten\r\n\r\n{}"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")


def test_a_chunked_body_over_the_limit_is_refused(server):
    def chunks():  # no Content-Length: the bytes that arrive are counted
        yield b'{"texts": ["'
        for _ in range(MAX_BODY // 1000 + 1):
            yield b"x" * 1000
        yield b'"]}'

    response = server.client.post("/predict", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["field"] == "body"


def test_the_server_survives_every_bad_request(server):
    for body, _, _ in BAD:
        post(server, body)
    assert server.client.get("/health").json()["status"] == "ok"
    assert post(server, {"texts": [PAIR]}).status_code == 200


# --- batching --------------------------------------------------------------------------------------
def test_concurrent_requests_share_encoder_passes_and_get_their_own_answers(run, bundle, server):
    rows = dev_rows(run, "mrpc").iloc[:16]
    pairs = [[a, b] for a, b in zip(rows["sentence1"], rows["sentence2"])]
    alone = [post(server, {"texts": [p], "tasks": ["mrpc", "stsb"]}).json()["predictions"][0] for p in pairs]
    before = server.client.get("/health").json()

    async def ask_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post("/predict", json={"texts": [p], "tasks": ["mrpc", "stsb"]}) for p in pairs)
            )

    responses = asyncio.run(ask_all())
    after = server.client.get("/health").json()
    assert all(r.status_code == 200 for r in responses)
    # each text alone is unpadded, in a shared pass padded: equal up to float16 rounding
    bounds = {t: rounding_bounds(run, bundle, t, bundle.tasks[t].picked, "mrpc", rows["idx"]) for t in ("mrpc", "stsb")}
    for response, want, i in zip(responses, alone, range(len(pairs))):
        got = response.json()["predictions"][0]
        assert same_label_or_near_tie(
            got["mrpc"]["label"], want["mrpc"]["label"], want["mrpc"]["outputs"], bounds["mrpc"][i]
        )
        for task in ("stsb", "mrpc"):
            assert_close_within_rounding(
                got[task]["outputs"], want[task]["outputs"], bounds[task][i], rtol=1e-5, atol=1e-5, what=task
            )
    passes = after["encoder_passes"] - before["encoder_passes"]
    assert passes < len(pairs), (passes, after)
    assert after["largest_batch"] > 1


def test_a_failing_request_fails_alone_and_the_worker_keeps_running():
    from bertvision.serving.batching import Batcher, BatchFailed
    from bertvision.serving.items import TextItem

    calls = []

    def run(texts, questions):
        calls.append(len(texts))
        if any(t.texts == ("boom",) for t in texts):
            raise ValueError("boom")
        return [f"answer {t.texts[0]}" for t in texts], []

    async def scenario():
        batcher = Batcher(run, max_batch_size=8, max_wait_ms=50)
        await batcher.start()
        try:
            asks = [batcher.submit([TextItem((text,), {})], []) for text in ("a", "boom", "b")]
            results = await asyncio.gather(*asks, return_exceptions=True)
            later = await batcher.submit([TextItem(("c",), {})], [])
        finally:
            await batcher.stop()
        return results, later, batcher.stats

    results, later, stats = asyncio.run(scenario())
    assert results[0] == (["answer a"], []) and results[2] == (["answer b"], [])
    assert isinstance(results[1], BatchFailed) and "ValueError: boom" in str(results[1])
    assert later == (["answer c"], [])
    assert calls[0] == 3  # one batch first, then one by one
    assert stats.failed == 1 and stats.requests == 4


def answer_each(texts, questions):
    return [f"t:{t.texts[0]}" for t in texts], [f"q:{q.question}" for q in questions]


def test_a_batch_fills_to_its_bound_and_each_request_gets_its_own_answers():
    """Requests of texts and questions share batches of at most five inputs; the bound is
    reached exactly when the requests fill it, one that does not fit waits for the next batch,
    and each request gets exactly its own answers."""
    from bertvision.serving.batching import Batcher
    from bertvision.serving.items import QuestionItem, TextItem

    batches = []

    def request(name, texts, questions):
        return (
            [TextItem((f"{name}{i}",), {}) for i in range(texts)],
            [QuestionItem(f"{name}{i}?", "c", {}) for i in range(questions)],
        )

    sizes = {"a": (2, 1), "b": (1, 2), "c": (2, 0), "d": (0, 2), "e": (1, 0)}

    async def scenario():
        batcher = Batcher(answer_each, max_batch_size=5, max_wait_ms=200, observer=lambda *b: batches.append(b[:2]))
        await batcher.start()
        try:
            asks = [batcher.submit(*request(name, *n)) for name, n in sizes.items()]
            return await asyncio.wait_for(asyncio.gather(*asks), 10)
        finally:
            await batcher.stop()

    answers = asyncio.run(scenario())
    for (name, (texts, questions)), got in zip(sizes.items(), answers, strict=True):
        assert got == ([f"t:{name}{i}" for i in range(texts)], [f"q:{name}{i}?" for i in range(questions)])
    assert batches == [(1, 3), (2, 5), (2, 3)]  # (requests, inputs): a (b did not fit beside it), b + c, d + e


def test_stopping_answers_a_request_the_worker_holds_while_it_waits_for_more():
    """A request the worker has taken from the queue, waiting up to max_wait_ms for others to
    join its batch, is neither queued nor running: stop() took the worker for idle, cancelled it
    and the request was never answered."""
    from bertvision.serving.batching import Batcher
    from bertvision.serving.items import TextItem

    async def scenario():
        batcher = Batcher(answer_each, max_batch_size=8, max_wait_ms=500)
        await batcher.start()
        ask = asyncio.ensure_future(batcher.submit([TextItem(("a",), {})], []))
        await asyncio.sleep(0.1)  # the worker has it, and waits for more
        await batcher.stop(drain_seconds=5)
        return await asyncio.wait_for(ask, 2)

    assert asyncio.run(scenario()) == (["t:a"], [])


# --- the command line ------------------------------------------------------------------------------
def bundle_args(run, tiny_bert, tasks, task_settings, out) -> list[str]:
    """`bertvision bundle` on the 1-epoch checkpoint of ``run`` with its heads of ``tasks``."""
    heads = [f"{t}={run / 'heads' / t}" for t in tasks]
    return [
        *(
            "bundle",
            "--encoder-dir",
            str(run / "ft" / "ckpt-1"),
            "--tokenizer",
            str(tiny_bert),
            "--task-head-dirs",
            *heads,
        ),
        *("--task-settings", json.dumps(task_settings), "--precision", "fp32", "--out", str(out)),
    ]


def test_bundle_command_writes_what_write_bundle_writes(run, bundle, tiny_bert, tmp_path, capsys):
    from bertvision.commands.main import main

    out = tmp_path / "cli-bundle"
    task_settings = {"mrpc": {"max_length": 64}, "squad2": {"max_length": 96, "doc_stride": 32}}
    keys = json.dumps({"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1})
    status = main([*bundle_args(run, tiny_bert, ["mrpc", "squad2"], task_settings, out), "--provenance", keys])
    assert status == 0, capsys.readouterr().err
    assert set(load_bundle(out).tasks) == {"mrpc", "squad2"}
    written, reference = read_json(out / "bundle.json"), read_json(bundle.root / "bundle.json")
    assert written["tasks"] == {t: reference["tasks"][t] for t in ("mrpc", "squad2")}
    assert written["keys"] == reference["keys"]
    assert (out / "encoder" / "model.safetensors").read_bytes() == (
        bundle.root / "encoder" / "model.safetensors"
    ).read_bytes()


def test_a_bundle_told_its_heads_serves_those_alone_and_names_a_missing_one(run, tiny_bert, tmp_path, capsys):
    """A shared encoder's bundle serves `shared.heads` only (the cross-task table's candidates)."""
    from bertvision.commands.main import main

    out = tmp_path / "some-heads"
    assert main(bundle_args(run, tiny_bert, ["mrpc"], {"mrpc": {"heads": ["lp", "tok"]}}, out)) == 0
    assert set(load_bundle(out).tasks["mrpc"].heads) == {"lp", "tok"}
    status = main(bundle_args(run, tiny_bert, ["mrpc"], {"mrpc": {"heads": ["nope"]}}, tmp_path / "none"))
    assert status == 2 and "mrpc: none of the heads nope in " in capsys.readouterr().err


def test_bundle_command_refuses_settings_without_heads(run, tiny_bert, tmp_path, capsys):
    from bertvision.commands.main import main

    status = main(bundle_args(run, tiny_bert, ["mrpc"], {"stsb": {"max_length": 64}}, tmp_path / "b"))
    assert status == 2 and "--task-settings: stsb" in capsys.readouterr().err


def test_serve_command_names_a_broken_bundle_in_one_line(bundle, tmp_path, capsys):
    from bertvision.commands.main import main

    copy = tmp_path / "bundle"
    shutil.copytree(bundle.root, copy)
    (copy / "encoder" / "model.safetensors").rename(copy / "encoder" / "pytorch_model.bin")
    assert main(["serve", str(copy), "--port", "1"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and f"{copy / 'encoder'}: " in errors[0] and "safetensors only" in errors[0]


def test_an_auto_bundle_computes_states_in_the_precision_its_heads_were_trained_on(run, tiny_bert, tmp_path, caplog):
    """The heads' states were extracted in fp32 (their records say so): a bundle written with
    precision auto serves in fp32, whatever auto would pick on the machine that serves it."""
    records = [read_json(p) for p in (run / "heads").rglob("metrics.json")]
    assert records and {r["states_precision"] for r in records} == {"fp32"}
    bundle = write_bundle(
        tmp_path / "auto-bundle", run / "ft" / "ckpt-1", str(tiny_bert), bundle_tasks(run), {"backbone": "tiny"}, "auto"
    )
    assert bundle.precision == "fp32" and read_json(bundle.root / "bundle.json")["precision"] == "fp32"

    # heads whose states came in two precisions (extractions on machines that chose apart): auto
    # stays auto, the serving machine's, and the bundle says its answers may differ
    heads = tmp_path / "heads"
    shutil.copytree(run / "heads" / "stsb", heads / "stsb")
    shutil.copytree(run / "heads" / "rte", heads / "rte")
    one = next((heads / "rte").rglob("metrics.json"))
    one.write_text(json.dumps({**read_json(one), "states_precision": "bf16"}))
    tasks = {task: {"heads_dirs": [heads / task], "max_length": 64} for task in ("stsb", "rte")}
    with caplog.at_level(logging.WARNING):
        mixed = write_bundle(
            tmp_path / "mixed", run / "ft" / "ckpt-1", str(tiny_bert), tasks, {"backbone": "tiny"}, "auto"
        )
    assert mixed.precision == "auto" and "several precisions (bf16, fp32)" in caplog.text


# --- the Open Inference Protocol (KServe v2), with a real protocol client -------------------------
def triton(server):
    import tritonclient.http as triton_http

    return triton_http, triton_http.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)


def decoded(array) -> list[str]:
    """A BYTES output as strings (bytes when sent binary, str when sent as JSON)."""
    return [x.decode() if isinstance(x, bytes) else x for x in array]


def bytes_input(triton_http, name, values, binary):
    tensor = triton_http.InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_), binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary-tensors", "json-tensors"])
def test_the_protocol_client_gets_the_native_apis_answers(server, bundle, binary):
    triton_http, client = triton(server)
    assert client.is_server_live() and client.is_server_ready()
    assert all(client.is_model_ready(task) for task in TASKS)
    meta = client.get_model_metadata("mrpc")
    assert [t["name"] for t in meta["inputs"]] == ["text_a", "text_b"]
    assert {t["name"] for t in meta["outputs"]} == {"label", "label_id", "probabilities", "logits"}
    assert meta["parameters"]["default_head"] == bundle.tasks["mrpc"].picked
    pairs = [PAIR, ["The cat sat.", "Stocks fell."], ["A dog runs.", "A dog is running."]]
    native = post(server, {"texts": pairs, "tasks": ["mrpc", "stsb"]}).json()["predictions"]
    for task in ("mrpc", "stsb"):
        inputs = [
            bytes_input(triton_http, n, [p[k] for p in pairs], binary) for k, n in enumerate(("text_a", "text_b"))
        ]
        result = client.infer(task, inputs)
        if task == "mrpc":
            labels = decoded(result.as_numpy("label"))
            assert labels == [p["mrpc"]["label"] for p in native]
            assert result.as_numpy("probabilities").shape == (3, 2)
            want = [[p["mrpc"]["probabilities"][n] for n in bundle.tasks["mrpc"].label_names] for p in native]
            assert np.allclose(result.as_numpy("probabilities"), want, atol=1e-6)
        else:
            assert np.allclose(result.as_numpy("score"), [p["stsb"]["score"] for p in native], atol=1e-5)
    qa = [{"question": "Who plays?", "context": "A man plays the guitar in the park."}] * 2
    native_qa = post(server, {"qa": qa}).json()["answers"]
    inputs = [bytes_input(triton_http, n, [q[n] for q in qa], binary) for n in ("question", "context")]
    outputs = [
        triton_http.InferRequestedOutput("answer", binary_data=binary),
        triton_http.InferRequestedOutput("has_answer"),
    ]
    result = client.infer("squad2", inputs, outputs=outputs, parameters={"head": "lp"})
    assert decoded(result.as_numpy("answer")) == [a["squad2"]["answer"] for a in native_qa]
    assert list(result.as_numpy("has_answer")) == [a["squad2"]["has_answer"] for a in native_qa]
    assert result.as_numpy("score_diff") is None  # only the outputs asked for
    # answerability: the same question tensors, a label per question from its best window
    answerable = client.infer("squad2-answerable", inputs)
    assert decoded(answerable.as_numpy("label")) == [a["squad2-answerable"]["label"] for a in native_qa]
    want = [a["squad2-answerable"]["outputs"] for a in native_qa]
    assert np.allclose(answerable.as_numpy("logits"), want, atol=1e-6)


def test_a_json_protocol_answer_echoes_the_id_and_types_each_output_as_the_protocol_says(server, bundle):
    from bertvision.serving.v2 import MODEL_VERSION

    pairs = [PAIR, ["The cat sat.", "Stocks fell."]]
    inputs = [text_tensor("text_a", [p[0] for p in pairs]), text_tensor("text_b", [p[1] for p in pairs])]
    answer = v2_post(server, "mrpc", {"id": "r1", "inputs": inputs}).json()
    assert (answer["id"], answer["model_name"], answer["model_version"]) == ("r1", "mrpc", MODEL_VERSION)
    types = {"label": "BYTES", "label_id": "INT64", "probabilities": "FP32", "logits": "FP32"}
    assert {o["name"]: o["datatype"] for o in answer["outputs"]} == types
    declared = server.client.get("/v2/models/mrpc").json()["outputs"]
    assert {t["name"]: (t["datatype"], t["shape"]) for t in declared} == {
        name: (datatype, [-1] if name.startswith("label") else [-1, 2]) for name, datatype in types.items()
    }
    outputs = {o["name"]: o for o in answer["outputs"]}
    native = post(server, {"texts": pairs, "tasks": ["mrpc"]}).json()["predictions"]
    names = bundle.tasks["mrpc"].label_names
    assert outputs["label_id"]["data"] == [names.index(p["mrpc"]["label"]) for p in native]
    assert outputs["probabilities"]["shape"] == [2, 2] and outputs["label"]["shape"] == [2]
    qa = {"inputs": [text_tensor("question", ["Who plays?"]), text_tensor("context", ["A man plays the guitar."])]}
    answer = v2_post(server, "squad2", qa).json()
    assert "id" not in answer
    assert {o["name"]: o["datatype"] for o in answer["outputs"]} == {
        "answer": "BYTES",
        "has_answer": "BOOL",
        "score_diff": "FP32",
    }


def test_a_question_with_no_valid_span_has_a_score_diff_of_null_in_json(bundle):
    """FP32 NaN where no span is valid: JSON has no NaN, so null (a strict encoder refused NaN)."""
    from types import SimpleNamespace

    from bertvision.serving.v2 import infer_response

    results = [
        SimpleNamespace(answer="", has_answer=False, score_diff=None),
        SimpleNamespace(answer="Jane", has_answer=True, score_diff=1.5),
    ]
    response = infer_response(bundle.tasks["squad2"], {}, ["score_diff"], results)
    assert response["outputs"][0]["data"] == [None, 1.5]
    json.dumps(response, allow_nan=False)


def v2_post(server, task, body, **kw):
    return server.client.post(f"/v2/models/{task}/infer", json=body, **kw)


def text_tensor(name, values, datatype="BYTES", shape=None):
    return {"name": name, "datatype": datatype, "shape": shape or [len(values)], "data": values}


V2_BAD = [
    ("mrpc", {"inputs": [text_tensor("text_a", [""]), text_tensor("text_b", ["b"])]}, 400, "inputs.text_a[0]"),
    ("mrpc", {"id": {"a": 1}, "inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])]}, 400, "id"),
    ("nope", {"inputs": [text_tensor("text", ["a"])]}, 404, "model_name"),
    ("mrpc", {}, 400, "inputs"),
    ("mrpc", {"inputs": [text_tensor("text_a", ["a"])]}, 400, "inputs"),  # text_b missing
    ("mrpc", {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b", "c"])]}, 400, "inputs"),
    ("mrpc", {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text", ["b"])]}, 400, "inputs[1].name"),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", [1], "INT64"), text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.datatype",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"], shape=[2]), text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.shape",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["x" * (MAX_CHARS + 1)])]},
        413,
        "inputs.text_b[0]",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "outputs": [{"name": "score"}]},
        400,
        "outputs[0].name",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "parameters": {"head": "no"}},
        400,
        "parameters.head",
    ),
    (
        "squad2",
        {"inputs": [text_tensor("question", ["Who?"]), text_tensor("context", ["word " * 2000])]},
        413,
        "inputs.context[0]",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "parameters": "x"},
        400,
        "parameters",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "parameters": [1]},
        400,
        "parameters",
    ),
    (
        "mrpc",
        {"inputs": [{**text_tensor("text_a", ["a"]), "parameters": "x"}, text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.parameters",
    ),
    ("mrpc", {"inputs": [{**text_tensor("text_a", ["a"]), "name": ["text_a"]}]}, 400, "inputs[0].name"),
    ("mrpc", {"inputs": [{**text_tensor("text_a", ["a"]), "name": {}}]}, 400, "inputs[0].name"),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "outputs": [{"name": ["label"]}]},
        400,
        "outputs[0].name",
    ),
    (
        "mrpc",
        {
            "inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])],
            "outputs": [{"name": "label"}, {"name": "label"}],
        },
        400,
        "outputs[1].name",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"], shape=[True]), text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.shape",
    ),
    # nested deeper than its shape [2], or unlike the shape [2, 1]
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", [["a", "b"]], shape=[2]), text_tensor("text_b", ["b", "c"])]},
        400,
        "inputs.text_a.data",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", [["a", "b"]], shape=[2, 1]), text_tensor("text_b", ["b", "c"])]},
        400,
        "inputs.text_a.data",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", [[["a"]], [["b"]]], shape=[2, 1]), text_tensor("text_b", ["b", "c"])]},
        400,
        "inputs.text_a.data",
    ),
    (
        "mrpc",
        {
            "inputs": [
                {**text_tensor("text_a", ["a"]), "parameters": {"binary_data_size": "8"}},
                text_tensor("text_b", ["b"]),
            ]
        },
        400,
        "inputs.text_a.parameters.binary_data_size",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"] * (MAX_TEXTS + 1)), text_tensor("text_b", ["b"] * (MAX_TEXTS + 1))]},
        413,
        "inputs",
    ),
    # each of these was a 500 or a silent 200 had its check gone
    ("mrpc", [text_tensor("text_a", ["a"])], 400, "body"),
    ("mrpc", {"inputs": [1]}, 400, "inputs[0]"),
    ("mrpc", {"inputs": [text_tensor("text_a", [1]), text_tensor("text_b", ["b"])]}, 400, "inputs.text_a"),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])], "parameters": {"head": 5}},
        400,
        "parameters.head",
    ),
    ("mrpc", {"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_a", ["b"])]}, 400, "inputs[1].name"),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a"], shape=[1, 1, 1]), text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.shape",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", ["a", "b"], shape=[1, 2]), text_tensor("text_b", ["b"])]},
        400,
        "inputs.text_a.shape",
    ),
    (
        "mrpc",
        {"inputs": [text_tensor("text_a", [["a", "b"], []], shape=[2, 1]), text_tensor("text_b", ["b", "c"])]},
        400,
        "inputs.text_a.data",
    ),
    (
        "mrpc",
        {
            "inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])],
            "outputs": [{"name": "label", "parameters": "x"}],
        },
        400,
        "outputs[0].parameters",
    ),
]


@pytest.mark.parametrize("task, body, status, field", V2_BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(V2_BAD)])
def test_bad_protocol_requests_are_a_4xx_naming_the_field(server, task, body, status, field):
    response = v2_post(server, task, body)
    assert response.status_code == status, response.text
    assert response.json()["field"] == field and response.json()["error"].startswith(f"{field}"), response.text


def test_nested_inputs_as_the_shape_says_are_read_as_flat_ones(server):
    flat = {"inputs": [text_tensor("text_a", ["a", "b"], shape=[2, 1]), text_tensor("text_b", ["c", "d"])]}
    nested = {"inputs": [text_tensor("text_a", [["a"], ["b"]], shape=[2, 1]), text_tensor("text_b", ["c", "d"])]}
    assert v2_post(server, "mrpc", nested).json()["outputs"] == v2_post(server, "mrpc", flat).json()["outputs"]


@pytest.mark.parametrize(
    "method, path, content, status",
    [
        ("POST", "/v2/models/mrpc/infer", b"{" + b'"a": [' * 3000 + b"]" * 3000 + b"}", 400),  # too deep to parse
        ("POST", "/v2/models/mrpc/infer", b"[" * 5000 + b"]" * 5000, 400),
        ("POST", "/v2/models/mrpc/infer", b"x" * (MAX_BODY + 1), 413),
        ("GET", "/v2/models/mrpc/infer", b"", 405),
        ("GET", "/v2/repository/index", b"", 404),
    ],
    ids=["deep-object", "deep-list", "too-large", "method", "no-such-path"],
)
def test_every_refusal_under_v2_is_in_the_protocols_error_form(server, method, path, content, status):
    response = server.client.request(method, path, content=content)
    assert response.status_code == status, response.text
    assert set(response.json()) <= {"error", "field"} and response.json()["error"], response.text
    if status == 413:  # read to its end and dropped: the connection serves the next request (it was reset)
        assert response.headers.get("connection") != "close"
        assert server.client.get("/v2/health/live").status_code == 200


def test_a_body_far_over_the_limit_is_refused_unread_and_the_answer_says_the_connection_ends(server):
    """Past a few times the limit the body is not read: the server closes the connection and says
    so, so that a client opens a new one for its next request instead of reading a reset."""
    from bertvision.serving.app import DRAINED_LIMITS

    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/predict", content=b"x" * (2 * DRAINED_LIMITS * MAX_BODY))
        assert response.status_code == 413 and response.headers.get("connection") == "close", response.headers
        assert client.get("/health").status_code == 200


def test_the_docs_pages_example_requests_ask_only_the_tasks_served_and_are_answered(server):
    examples = server.client.get("/openapi.json").json()["paths"]["/predict"]["post"]["requestBody"]["content"][
        "application/json"
    ]["examples"]
    assert set(examples) == {"a pair of texts", "a question"}  # this bundle serves no single-text task
    for example in examples.values():
        response = post(server, example["value"])
        assert response.status_code == 200, response.text


def test_binary_bytes_no_tensor_declares_are_refused(server):
    """A binary body longer than its tensors' sizes: a size given wrong, refused (its tail was passed over)."""
    import struct

    def body(tail_extra: bytes):
        encoded = [struct.pack("<I", len(t.encode())) + t.encode() for t in PAIR]
        inputs = [{**text_tensor(n, []), "shape": [1], "parameters": {"binary_data_size": len(e)}}
                  for n, e in zip(("text_a", "text_b"), encoded, strict=True)]  # fmt: skip
        header = json.dumps({"inputs": [{k: v for k, v in t.items() if k != "data"} for t in inputs]}).encode()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        return server.client.post("/v2/models/mrpc/infer", content=header + b"".join(encoded) + tail_extra,
                                   headers=headers)  # fmt: skip

    assert body(b"").status_code == 200
    response = body(b"GARBAGE")
    assert response.status_code == 400 and response.json()["field"] == "inputs", response.text


@pytest.mark.parametrize(
    "text_a, header_extra, field, problem",
    [
        (struct.pack("<I", 4) + b"caf\xe9", 0, "inputs.text_a", "not UTF-8 text"),
        (struct.pack("<I", 1) + b"a" + b"\x01\x00", 0, "inputs.text_a", "ends inside an element's length"),
        (struct.pack("<I", 1) + b"a", 100, "Inference-Header-Content-Length", "but the body has"),
    ],
    ids=["latin-1", "cut-length", "header-past-body"],
)
def test_a_binary_tensor_that_cannot_be_read_is_a_400_naming_it(server, text_a, header_extra, field, problem):
    text_b = struct.pack("<I", 1) + b"b"
    inputs = [{"name": n, "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(e)}}
              for n, e in (("text_a", text_a), ("text_b", text_b))]  # fmt: skip
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header) + header_extra)}
    response = server.client.post("/v2/models/mrpc/infer", content=header + text_a + text_b, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field and problem in response.json()["error"], response.text


def test_a_binary_element_whose_length_runs_past_its_tensor_is_refused_not_cut(server):
    """An element's 4-byte length larger than the bytes left: it was read short, a text cut at the end."""
    import struct

    text = PAIR[0].encode()
    short = struct.pack("<I", len(text) + 5) + text  # says 5 bytes more than there are
    whole = struct.pack("<I", len(PAIR[1].encode())) + PAIR[1].encode()
    inputs = [{"name": n, "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(e)}}
              for n, e in (("text_a", short), ("text_b", whole))]  # fmt: skip
    header = json.dumps({"inputs": inputs}).encode()
    response = server.client.post("/v2/models/mrpc/infer", content=header + short + whole,
                                  headers={"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    assert response.status_code == 400, response.text
    assert response.json()["error"].endswith(f"binary BYTES element of {len(text) + 5} bytes runs past the data")


def test_a_route_that_reads_answers_head(server):
    """Load balancers check health with HEAD: 200 and no body (it was 405)."""
    for path in ("/health", "/ready", "/v2/health/ready", "/v2/models/mrpc"):
        response = server.client.head(path)
        assert response.status_code == 200 and response.content == b"", (path, response.status_code)


def test_inputs_of_different_lengths_are_refused_naming_each_inputs_count(server):
    body = {"inputs": [text_tensor("question", ["Who?", "What?"]), text_tensor("context", ["Jane."])]}
    response = v2_post(server, "squad2", body)
    assert response.status_code == 400 and response.json()["error"] == (
        "inputs: the inputs hold different numbers of items (question 2, context 1); give one per example in each"
    )


def test_the_protocol_client_sees_a_refusal_as_an_error(server):
    from tritonclient.utils import InferenceServerException

    triton_http, client = triton(server)
    with pytest.raises(InferenceServerException, match="text_b"):
        client.infer("mrpc", [bytes_input(triton_http, "text_a", ["only one"], True)])
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")


def test_the_protocol_client_may_name_the_models_version(server):
    """A client pinned to the version the metadata lists reaches the same model by the versioned
    paths; another version is a 404 naming it."""
    from tritonclient.utils import InferenceServerException

    triton_http, client = triton(server)
    (version,) = client.get_model_metadata("mrpc")["versions"]
    assert client.get_model_metadata("mrpc", model_version=version)["name"] == "mrpc"
    assert client.is_model_ready("mrpc", model_version=version)
    inputs = [bytes_input(triton_http, n, [t], False) for n, t in zip(("text_a", "text_b"), PAIR, strict=True)]
    assert decoded(client.infer("mrpc", inputs, model_version=version).as_numpy("label")) == [
        post(server, {"texts": [PAIR], "tasks": ["mrpc"]}).json()["predictions"][0]["mrpc"]["label"]
    ]
    with pytest.raises(InferenceServerException, match="version"):
        client.infer("mrpc", inputs, model_version="2")
    response = server.client.get("/v2/models/mrpc/versions/2")
    assert response.status_code == 404 and response.json()["field"] == "model_version"


# --- operations: metrics, readiness, access log, graceful shutdown ----------------------------------
def metric_samples(text: str) -> dict:
    """(name, sorted labels) -> value of every sample in a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def scrape(server) -> dict:
    response = server.client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return metric_samples(response.text)


def test_metrics_count_requests_statuses_batches_and_passes(server, caplog):
    caplog.set_level("INFO", logger="bertvision.access")
    before = scrape(server)
    assert post(server, {"texts": [PAIR]}).status_code == 200
    assert post(server, {"texts": []}).status_code == 422
    after = scrape(server)

    def count(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert count("bertvision_requests_total", route="/predict", method="POST", status="200") == 1
    assert count("bertvision_requests_total", route="/predict", method="POST", status="422") == 1
    assert count("bertvision_request_seconds_count", route="/predict") == 2
    assert count("bertvision_batch_inputs_count") == 1 and count("bertvision_batch_inputs_sum") == 1
    assert count("bertvision_encoder_passes_total") == 1
    assert after[("bertvision_ready", ())] == 1 and after[("bertvision_queue_depth", ())] == 0
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "bertvision.access"]
    assert any(line["status"] == 422 and line["route"] == "/predict" and line["method"] == "POST" for line in lines)


def test_liveness_and_readiness(server):
    assert server.client.get("/health").status_code == 200
    assert server.client.get("/ready").json() == {"ready": True}
    assert server.client.get("/v2/health/ready").status_code == 200
    assert server.client.get("/v2/health/live").json() == {"live": True}
    assert {m["name"] for m in server.client.get("/v2/models").json()["models"]} == set(TASKS)


def test_shutdown_answers_every_queued_request(bundle):
    """Requests queued behind a held model when the server is told to stop all get their answers."""
    from bertvision.serving.app import ServeSettings, create_app
    from bertvision.serving.engine import Engine

    engine = Engine(bundle.root, "cpu")
    answer = engine.predict
    hold, release = threading.Event(), threading.Event()

    def held(texts, questions):
        if hold.is_set():  # from after the start-up's warm-up pass
            release.wait(timeout=60)
        return answer(texts, questions)

    engine.predict = held
    settings = ServeSettings(max_batch_size=1, max_wait_ms=0, device="cpu")
    results = []
    with Server(create_app(bundle.root, settings, engine=engine)) as running:
        hold.set()

        def ask():
            results.append(httpx.post(f"{running.url}/predict", json={"texts": [PAIR]}, timeout=60).status_code)

        def waiting() -> float:
            page = httpx.get(f"{running.url}/metrics", timeout=10).text
            return metric_samples(page)[("bertvision_queue_depth", ())]

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        # The stop comes once every request is in: one held at the model, five queued behind it
        # (a fixed sleep let a slow machine stop the server before all six had connected).
        deadline = time.monotonic() + 60
        while waiting() < 5:
            assert time.monotonic() < deadline, "the six requests never all reached the service"
            time.sleep(0.02)
        running.server.should_exit = True
        release.set()
        for t in threads:
            t.join(timeout=60)
    assert results == [200] * 6


def test_a_model_that_fails_on_a_request_is_a_500_naming_its_error_in_each_api(bundle):
    """Not the client's fault: a 500 with the model's error, in each API's own error form."""
    from bertvision.serving.app import ServeSettings, create_app
    from bertvision.serving.engine import Engine

    engine = Engine(bundle.root, "cpu")
    answer, failing = engine.predict, threading.Event()

    def predict(texts, questions):
        if failing.is_set():  # from after the start-up's warm-up pass
            raise RuntimeError("CUDA out of memory")
        return answer(texts, questions)

    engine.predict = predict
    with Server(create_app(bundle.root, ServeSettings(device="cpu"), engine=engine)) as running:
        failing.set()
        native = httpx.post(f"{running.url}/predict", json={"texts": [PAIR]}, timeout=60)
        inputs = [text_tensor("text_a", [PAIR[0]]), text_tensor("text_b", [PAIR[1]])]
        v2 = httpx.post(f"{running.url}/v2/models/mrpc/infer", json={"inputs": inputs}, timeout=60)
        failing.clear()
        assert httpx.post(f"{running.url}/predict", json={"texts": [PAIR]}, timeout=60).status_code == 200
    assert native.status_code == 500 and "RuntimeError: CUDA out of memory" in native.json()["detail"], native.text
    assert v2.status_code == 500 and "RuntimeError: CUDA out of memory" in v2.json()["error"], v2.text


def test_the_serve_command_logs_json_access_lines_and_stops_cleanly_on_sigterm(bundle):
    import signal
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "bertvision", "serve", str(bundle.root), "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not become ready"
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert httpx.post(f"{url}/predict", json={"texts": [PAIR]}, timeout=60).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    # uvicorn re-raises the signal once it has shut down, so the exit status says SIGTERM
    assert proc.returncode in (0, -signal.SIGTERM) and "Application shutdown complete" in out, out[-2000:]
    access = [json.loads(line[line.index("{") :]) for line in out.splitlines() if '"route": "/predict"' in line]
    assert access and access[-1]["status"] == 200 and access[-1]["method"] == "POST", out[-2000:]


# --- several bundles behind one service ----------------------------------------------------------
def test_two_bundles_serve_their_tasks_each_with_its_own_encoder_pass(run, tiny_bert, bundle, server):
    from bertvision.serving.app import create_app

    meta = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    tasks = bundle_tasks(run)
    pairs_bundle = write_bundle(
        run / "bundle-mrpc", run / "ft" / "ckpt-1", str(tiny_bert), {"mrpc": tasks["mrpc"]}, meta, "fp32"
    )
    rest = {k: v for k, v in tasks.items() if k != "mrpc"}
    rest_bundle = write_bundle(run / "bundle-rest", run / "ft" / "ckpt-1", str(tiny_bert), rest, meta, "fp32")
    body = {
        "texts": [PAIR, ["The cat sat.", "Stocks fell."]],
        "qa": [{"question": "Who plays?", "context": "A man plays."}],
    }
    single = post(server, body).json()
    settings = server.app.state.settings
    with Server(create_app([pairs_bundle.root, rest_bundle.root], settings)) as running:
        client = httpx.Client(base_url=running.url, timeout=60)
        summary = client.get("/tasks").json()
        assert [sorted(e["tasks"]) for e in summary["encoders"]] == [
            ["mrpc"],
            ["rte", "squad2", "squad2-answerable", "stsb"],
        ]
        assert {n: t["encoder"] for n, t in summary["tasks"].items()} == {
            "mrpc": 0,
            "stsb": 1,
            "rte": 1,
            "squad2": 1,
            "squad2-answerable": 1,
        }
        before = client.get("/health").json()["encoder_passes"]
        response = client.post("/predict", json=body)
        assert response.status_code == 200, response.text
        assert client.get("/health").json()["encoder_passes"] == before + 2  # one pass per encoder
        both = response.json()
        for got, want in zip(both["predictions"], single["predictions"]):
            assert set(got) == {"mrpc", "rte", "stsb"} and got["mrpc"]["label"] == want["mrpc"]["label"]
            assert got["stsb"]["score"] == pytest.approx(want["stsb"]["score"], abs=1e-5)
        assert both["answers"][0]["squad2"]["best_span"] == single["answers"][0]["squad2"]["best_span"]
        assert (
            client.post(
                "/v2/models/mrpc/infer", json={"inputs": [text_tensor("text_a", ["a"]), text_tensor("text_b", ["b"])]}
            ).status_code
            == 200
        )
        client.close()
    with pytest.raises(BundleError, match="task mrpc is also served by"):
        create_app([bundle.root, pairs_bundle.root], settings)
    with pytest.raises(BundleError, match=f"{pairs_bundle.root}: given twice"):
        create_app([pairs_bundle.root, pairs_bundle.root], settings)
    empty = bundle.root.parent / "empty-set"
    empty.mkdir(exist_ok=True)
    (empty / "bundles.json").write_text('{"bundles": {}}')  # it served the working directory's bundle.json
    with pytest.raises(BundleError, match=f"^{empty / 'bundles.json'}: lists no bundles$"):
        bundle_paths([empty])


# --- load and faults ---------------------------------------------------------------------------
def slow_engine(bundle, seconds: float):
    from bertvision.serving.engine import Engine

    engine = Engine(bundle.root, "cpu")
    answer = engine.predict

    def slow(texts, questions):
        time.sleep(seconds)
        return answer(texts, questions)

    engine.predict = slow
    return engine


def test_a_burst_beyond_the_queue_bound_gets_503s_and_nothing_else(bundle):
    from bertvision.serving.app import ServeSettings, create_app

    settings = ServeSettings(max_batch_size=1, max_wait_ms=0, max_queued=4, device="cpu")
    with Server(create_app(bundle.root, settings, engine=slow_engine(bundle, 0.1))) as running:

        async def burst():
            async with httpx.AsyncClient(base_url=running.url, timeout=60) as client:
                asks = [client.post("/predict", json={"texts": [PAIR]}) for _ in range(40)]
                return [r.status_code for r in await asyncio.gather(*asks)]

        statuses = asyncio.run(burst())
    # the queue's 4 (one of them already in the model) and at most one more; the rest refused at once
    assert set(statuses) == {200, 503} and 4 <= statuses.count(200) <= 6, statuses


@pytest.mark.parametrize("api", ["predict", "v2"])
def test_a_request_whose_client_has_gone_is_not_computed(bundle, api):
    """Eight clients send a request each and hang up while the first is in the model: the seven
    still queued are dropped (recorded as 499), not computed one after another for nobody."""
    from bertvision.serving.app import ServeSettings, create_app

    path, body = (
        ("/predict", {"texts": [PAIR]})
        if api == "predict"
        else ("/v2/models/mrpc/infer", {"inputs": [text_tensor("text_a", PAIR[:1]), text_tensor("text_b", PAIR[1:])]})
    )
    content = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {len(content)}\r\n\r\n"
    ).encode() + content
    settings = ServeSettings(max_batch_size=1, max_wait_ms=0, device="cpu")
    with Server(create_app(bundle.root, settings, engine=slow_engine(bundle, 0.3))) as running:
        host, port = running.url.removeprefix("http://").split(":")
        clients = [socket.create_connection((host, int(port)), timeout=10) for _ in range(8)]
        for client in clients:
            client.sendall(request)
        time.sleep(0.15)
        for client in clients:
            client.close()
        time.sleep(8 * 0.3 + 0.5)  # time enough to have computed all eight
        with httpx.Client(base_url=running.url, timeout=60) as client:
            assert client.get("/health").json()["requests"] <= 2
            closed = metric_samples(client.get("/metrics").text)
    route = path if api == "predict" else "/v2/models/{name}/infer"
    key = ("bertvision_requests_total", tuple(sorted({"route": route, "method": "POST", "status": "499"}.items())))
    assert closed.get(key, 0) >= 6


def test_a_client_that_hangs_up_mid_body_is_a_499_of_its_route_and_a_body_over_the_limit_a_413_of_its_own(server):
    """Not a 500 of no route: a client's timeout would fire a 5xx alert. A 413 answered before
    routing is counted under the route its path matches."""
    host, port = server.url.removeprefix("http://").split(":")
    before = metric_samples(server.client.get("/metrics").text)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b'POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"t'
        )
        time.sleep(0.3)
    too_large = b'{"texts": ["' + b"x" * MAX_BODY + b'"]}'
    assert (
        server.client.post("/predict", content=too_large, headers={"content-type": "application/json"}).status_code
        == 413
    )

    def count(status, route="/predict"):
        key = ("bertvision_requests_total", tuple(sorted({"route": route, "method": "POST", "status": status}.items())))
        return metric_samples(server.client.get("/metrics").text).get(key, 0) - before.get(key, 0)

    deadline = time.monotonic() + 10
    while count("499") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count("499") == 1 and count("413") == 1
    assert count("500") == 0 and count("500", "unmatched") == 0 and count("413", "unmatched") == 0
    # under v2 too (its routes are an included router's), and the connection serves the next request
    # (the middleware failed on the included router: the client's next request on it was dropped)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/mrpc/infer", too_large, {"content-type": "application/json"})
        refused = connection.getresponse()
        assert refused.status == 413 and json.loads(refused.read())["field"] == "body"
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    assert count("413", "/v2/models/{name}/infer") == 1


def test_a_client_that_stalls_mid_body_does_not_delay_others(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as stalled:
        stalled.sendall(
            f"POST /predict HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
            "content-length: 1000\r\n\r\n".encode()
            + b'{"texts": [["half a'
        )
        t0 = time.perf_counter()
        for _ in range(5):
            assert post(server, {"texts": [PAIR]}).status_code == 200
        assert time.perf_counter() - t0 < 10


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_the_serve_benchmark_measures_load_memory_and_faults(bundle):
    """scripts/benchmark_serve.py end to end at a small size: its tables, no errors under load,
    and a burst answered with 200s and 503s only."""
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark_serve.py"), "--bundle", str(bundle.root),
         "--requests", "6", "--seconds", "5", "--concurrency", "1", "4", "--memory-requests", "20", "40",
         "--burst", "24", "--burst-queue", "2", "--batch", "4", "--repeats", "1", "--with-questions"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for concurrency in (1, 4):
        assert f"| 1 | {concurrency} | 6 | 0 |" in out
    assert "| 40 | " in out and "Resident memory after 40 requests" in out
    burst = next(line for line in out.splitlines() if line.startswith("Burst: 24 simultaneous"))
    assert "x 503" in burst and set(burst.rsplit(": ", 1)[1].rstrip(".").split(", ")) <= {
        f"{n} x {code}" for n in range(25) for code in (200, 503)
    }
    assert "| while another client stalls mid-body |" in out


# --- the picked bundles of a run (serving/picked.py) ------------------------------------------------
def picks_json(path, picks: dict[str, tuple[float, str, str | None]], ft_seed: int = 1):
    """A picks record (the tables stage's) of task -> (checkpoint, head, ensemble rule or None)."""
    from bertvision.reporting.picks import Pick, write_picks
    from bertvision.reporting.results import ensemble_name

    write_picks(
        [
            Pick("tiny", t, Checkpoint(f), ensemble_name(h, how) if how else h, h, how, ft_seed, 0.5, 0.5)
            for t, (f, h, how) in picks.items()
        ],
        path,
    )
    return path


def test_picked_bundles_serve_the_pick_record_and_name_what_they_cannot(run, tiny_bert, tmp_path):
    from bertvision.serving.bundle import bundle_paths
    from bertvision.serving.picked import CheckpointRun, write_picked_bundles

    one = Checkpoint(1)
    runs = [CheckpointRun(task, 1, one, run / "ft" / "ckpt-1", run / "heads" / task) for task in ("mrpc", "stsb")]
    settings = {"mrpc": {"max_length": 64}, "stsb": {"max_length": 64}}
    picks = picks_json(tmp_path / "picks.json", {"mrpc": (1.0, "tok", None), "stsb": (1.0, "ad8", None)})
    out = tmp_path / "picked"
    index = write_picked_bundles(out, picks, "tiny", runs, str(tiny_bert), settings, {"backbone": "tiny"}, "fp32")
    assert index["picks"]["mrpc"]["bundle"] == "mrpc-ft1-ckpt-1" and index["picks"]["mrpc"]["model"] == "tok"
    assert index["picks"]["stsb"]["model"] == "ad8"
    paths = bundle_paths([out])
    assert [p.name for p in paths] == ["mrpc-ft1-ckpt-1", "stsb-ft1-ckpt-1"]
    assert [load_bundle(p).tasks[t].picked for p, t in zip(paths, ("mrpc", "stsb"))] == ["tok", "ad8"]
    # stsb's heads have no ensembles scored (they read MRPC's checkpoint): one picked is named
    ensemble = picks_json(tmp_path / "ensemble.json", {"mrpc": (1.0, "tok", None), "stsb": (1.0, "ad8", "mean")})
    with pytest.raises(BundleError, match=r"stsb/ad8/seed\d/metrics.json: no ensemble 'mean'"):
        write_picked_bundles(tmp_path / "p1", ensemble, "tiny", runs, str(tiny_bert), settings, {}, "fp32")

    missing = picks_json(tmp_path / "only-mrpc.json", {"mrpc": (1.0, "lp", None)})
    with pytest.raises(BundleError, match=r"only-mrpc.json: no picked path for stsb \(backbone tiny\)"):
        write_picked_bundles(tmp_path / "p2", missing, "tiny", runs, str(tiny_bert), settings, {}, "fp32")
    unknown = picks_json(tmp_path / "unknown.json", {"mrpc": (1.0, "cnn", None), "stsb": (1.0, "lp", None)})
    with pytest.raises(BundleError, match=r"mrpc: the pick 'cnn' at checkpoint 1 is none of the heads"):
        write_picked_bundles(tmp_path / "p3", unknown, "tiny", runs, str(tiny_bert), settings, {}, "fp32")
    elsewhere = picks_json(tmp_path / "elsewhere.json", {"mrpc": (0.5, "lp", None), "stsb": (1.0, "lp", None)})
    with pytest.raises(BundleError, match=r"mrpc: no checkpoint 0.5 of fine-tuning seed 1 among the run's heads"):
        write_picked_bundles(tmp_path / "p4", elsewhere, "tiny", runs, str(tiny_bert), settings, {}, "fp32")
    other_seed = picks_json(tmp_path / "seed2.json", {"mrpc": (1.0, "lp", None), "stsb": (1.0, "lp", None)}, 2)
    with pytest.raises(BundleError, match=r"mrpc: no checkpoint 1 of fine-tuning seed 2 among the run's heads"):
        write_picked_bundles(tmp_path / "p5", other_seed, "tiny", runs, str(tiny_bert), settings, {}, "fp32")
    assert not any((tmp_path / p).exists() for p in ("p1", "p2", "p3", "p4", "p5"))
    from bertvision.reporting.picks import Pick, read_picks, write_picks

    both = tmp_path / "two-backbones.json"  # another backbone's picks after tiny's: served for it alone
    write_picks([*read_picks(picks), Pick("other", "mrpc", one, "cnn", "cnn", None, 1, 0.9, 0.9)], both)
    index = write_picked_bundles(tmp_path / "p6", both, "tiny", runs, str(tiny_bert), settings, {}, "fp32")
    assert index["picks"]["mrpc"]["model"] == "tok"

    (out / "bundles.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"picked/bundles.json: not a bundle set index"):
        bundle_paths([out])


def test_serve_bundles_serves_the_seed_the_pick_record_names_and_reads_no_table(run, tiny_bert, tmp_path):
    """Two fine-tuning seeds whose heads score alike: re-deriving the seed from selection scores
    would serve seed 1; the pick record says 2, and 2 is served. The rule reads the record, not
    the summary table."""
    import re

    from bertvision import layout
    from bertvision.serving.picked import CheckpointRun, write_picked_bundles
    from tests.conftest import REPO

    runs = [CheckpointRun("mrpc", s, Checkpoint(1), run / "ft" / "ckpt-1", run / "heads" / "mrpc") for s in (1, 2)]
    picks = picks_json(tmp_path / "picks.json", {"mrpc": (1.0, "lp", None)}, ft_seed=2)
    out = tmp_path / "picked"
    index = write_picked_bundles(out, picks, "tiny", runs, str(tiny_bert), {"mrpc": {"max_length": 64}}, {}, "fp32")
    assert index["picks"]["mrpc"]["ft_seed"] == 2 and index["picks"]["mrpc"]["bundle"] == "mrpc-ft2-ckpt-1"
    assert load_bundle(out / "mrpc-ft2-ckpt-1").tasks["mrpc"].picked == "lp"
    rules = (REPO / "rules" / "serve.smk").read_text()
    inputs = re.search(r"^rule serve_bundles:\n(.*?)output:", rules, re.M | re.S).group(1)
    assert "picks=L.picks_record()" in inputs and "summary" not in inputs
    assert layout.picks_record() == f"{layout.TABLES_DIR}/{layout.PICKS}"


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_head_plus_bert_ensemble_is_served_as_it_was_evaluated(run, tiny_bert, tmp_path, monkeypatch, backend):
    """The summary picked MRPC's lp + BERT (mean) on MRPC's own checkpoint: its bundle keeps the
    task model, and the served outputs are the evaluation's combination of the head's and BERT's,
    on either runtime (ONNX Runtime's answer for a classifier once failed the service's start)."""
    from bertvision.evaluation.ensemble import ensemble_examples, load_logits, prediction_column
    from bertvision.serving.app import ServeSettings, create_app
    from bertvision.serving.picked import CheckpointRun, write_picked_bundles

    runs = [CheckpointRun("mrpc", 1, Checkpoint(1), run / "ft" / "ckpt-1", run / "heads" / "mrpc")]
    picks = picks_json(tmp_path / "picks.json", {"mrpc": (1.0, "lp", "mean")})
    out = tmp_path / "picked"
    index = write_picked_bundles(out, picks, "tiny", runs, str(tiny_bert), {"mrpc": {"max_length": 64}}, {}, "fp32")
    assert index["picks"]["mrpc"]["model"] == "lp + BERT (mean)" and index["picks"]["mrpc"]["head"] == "lp"
    served = load_bundle(out / "mrpc-ft1-ckpt-1")
    assert served.task_model == "mrpc" and served.tasks["mrpc"].picked == "lp + BERT (mean)"

    rows = dev_rows(run, "mrpc")
    record_dir = head_run_dir(run / "heads" / "mrpc", "lp", served.tasks["mrpc"].heads["lp"].seed)
    expected = pd.read_parquet(record_dir / HEAD_PREDICTIONS)
    expected = expected[expected["split"] == "dev"].set_index("idx")
    order = pd.read_parquet(run / "tokens" / "mrpc" / "dev.parquet", columns=["idx"])["idx"]
    bert = pd.Series(list(np.concatenate(load_logits(run / "ft" / "ckpt-1" / BERT_LOGITS)["dev"])), index=order)
    want = ensemble_examples(
        np.stack(expected.loc[rows["idx"], "outputs"]), np.stack(bert.loc[rows["idx"]]), "mean", "classification"
    )
    # the ensemble's predictions as the head job kept them, for the summary's paired bootstrap
    assert (expected.loc[rows["idx"], prediction_column("mean")].to_numpy() == want.argmax(-1)).all()
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path / "cache"))
    settings = ServeSettings(max_texts=64, device="cpu", backend=backend)
    with Server(create_app(out, settings)) as running:
        client = httpx.Client(base_url=running.url, timeout=60)
        texts = [[a, b] for a, b in zip(rows["sentence1"], rows["sentence2"])]
        response = client.post("/predict", json={"texts": texts, "tasks": ["mrpc"]})
        assert response.status_code == 200, response.text
        answers = [p["mrpc"] for p in response.json()["predictions"]]
    assert all(a["head"] == "lp + BERT (mean)" for a in answers)
    got = np.array([a["outputs"] for a in answers])
    assert np.allclose(got, want, atol=2e-3), np.abs(got - want).max()
    alone = ensemble_examples(
        np.stack(expected.loc[rows["idx"], "outputs"]), np.zeros_like(want), "mean", "classification"
    )
    assert not np.allclose(got, alone, atol=2e-3)  # BERT's outputs count


@pytest.fixture(scope="module")
def question_checkpoints(run, tiny_bert):
    """SQuAD 2.0 spans and answerability each fine-tuned on its own (checkpoints 0 and 1), states
    extracted from its checkpoint 1 and heads trained there with BERT's outputs at hand: the
    question tasks' head + BERT ensembles are scored."""
    settings = run_settings(tiny_bert)
    own = run / "own"
    for task in ("squad2", "squad2-answerable"):
        checkpoint = own / "ft" / task / "ckpt-1"
        fine_tune(settings, "tiny", task, run, checkpoint.parent)
        extract_and_train(settings, "tiny", task, run, checkpoint, own, checkpoint / BERT_LOGITS)
    return own


def picked_ensemble(run, own, tiny_bert, out, task: str, fraction: float = 1.0):
    """The picked bundles of a pick record that picked ``task``'s lp + BERT (mean) at ``fraction``."""
    from bertvision.serving.picked import CheckpointRun, write_picked_bundles

    checkpoint = Checkpoint(fraction)
    runs = [CheckpointRun(task, 1, checkpoint, own / "ft" / task / f"ckpt-{checkpoint}", own / "heads" / task)]
    picks = picks_json(out.with_suffix(".json"), {task: (fraction, "lp", "mean")})
    settings = {task: {"max_length": 96, "doc_stride": 32}}
    return write_picked_bundles(out, picks, "tiny", runs, str(tiny_bert), settings, {}, "fp32")


def served_questions(bundle_dir, task: str, rows: pd.DataFrame) -> list[dict]:
    from bertvision.serving.app import ServeSettings, create_app

    settings = ServeSettings(max_texts=64, device="cpu")
    with Server(create_app(bundle_dir, settings)) as running:
        client = httpx.Client(base_url=running.url, timeout=60)
        qa = [{"question": q, "context": c} for q, c in zip(rows["question"], rows["context"])]
        response = client.post("/predict", json={"qa": qa, "tasks": [task]})
        assert response.status_code == 200, response.text
    return [a[task] for a in response.json()["answers"]]


def test_a_span_ensemble_is_served_as_it_was_evaluated(run, question_checkpoints, tiny_bert, tmp_path):
    """SQuAD's lp + BERT (mean) on SQuAD's own checkpoint: the bundle keeps the QA model; each
    window's head and BERT start/end logits are combined as the evaluation combines them, decoded,
    and cut at the ensemble's own null threshold (tuned on selection)."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.ensemble import ensemble_windows, load_logits
    from bertvision.evaluation.squad_decode import decode_question
    from tests.rounding import near_best_spans

    task, own = "squad2", question_checkpoints
    index = picked_ensemble(run, own, tiny_bert, tmp_path / "picked", task)
    assert index["picks"][task]["bundle"] == "squad2-ft1-ckpt-1" and index["picks"][task]["model"] == "lp + BERT (mean)"
    served = load_bundle(tmp_path / "picked" / "squad2-ft1-ckpt-1")
    entry = served.tasks[task]
    assert served.task_model == task and entry.picked == "lp + BERT (mean)"
    record = read_json(head_run_dir(own / "heads" / task, "lp", entry.heads["lp"].seed) / HEAD_METRICS)
    threshold = record["ensembles"]["mean"]["selection"]["null_threshold"]
    assert entry.heads["lp + BERT (mean)"].null_threshold == threshold

    rows = dev_rows(run, task)
    tokens = run / "tokens" / task / "dev.parquet"
    windows = TokenizedSplit.read(tokens)
    head = bundle_head(served, task, "lp")
    x, _ = float32_states(served.encoder_dir, tokens, "tokens")
    with torch.no_grad():
        head_logits = head(torch.from_numpy(x.astype(np.float16).astype(np.float32))).numpy()
    heads = [head_logits[w, :n] for w, n in enumerate(windows.lengths)]
    bert = load_logits(own / "ft" / task / "ckpt-1" / BERT_LOGITS)["dev"]
    combined = ensemble_windows(heads, bert, "mean")
    tolerances = span_tolerances(head, served.encoder_dir, tokens, list(rows["context"]), entry.max_answer_length, 1e-4)

    answers = served_questions(tmp_path / "picked", task, rows)
    alone_differs = False
    for q, (answer, context) in enumerate(zip(answers, rows["context"])):
        mine = np.flatnonzero(windows.idx == q)
        spans = [(combined[w][:, 0], combined[w][:, 1], windows.offsets[w]) for w in mine]
        want = decode_question(spans, context, entry.n_best, entry.max_answer_length)
        tolerance = 2 * tolerances[q][0]  # a log-softmax moves by at most twice its inputs' largest move
        assert answer["head"] == "lp + BERT (mean)" and answer["null_threshold"] == threshold
        assert answer["score_diff"] == pytest.approx(want.score_diff, abs=tolerance)
        near = near_best_spans(spans, context, entry.max_answer_length, tolerance)
        assert answer["best_span"] == want.text or {answer["best_span"], want.text} <= near
        assert answer["has_answer"] == (answer["score_diff"] > threshold)
        alone = decode_question(
            [(heads[w][:, 0], heads[w][:, 1], windows.offsets[w]) for w in mine],
            context,
            entry.n_best,
            entry.max_answer_length,
        )
        alone_differs |= abs(alone.score_diff - answer["score_diff"]) > tolerance
    assert alone_differs  # BERT's logits count


def test_an_answerability_ensemble_is_served_as_it_was_evaluated(run, question_checkpoints, tiny_bert, tmp_path):
    """Answerability's lp + BERT (mean): each window's head and BERT outputs combined, then the
    question's label from its best window, as the evaluation scored the ensemble."""
    from bertvision.evaluation.ensemble import ensemble_examples, load_logits
    from bertvision.registry.metrics import best_window, question_gold

    task, own = "squad2-answerable", question_checkpoints
    index = picked_ensemble(run, own, tiny_bert, tmp_path / "picked", task)
    served = load_bundle(tmp_path / "picked" / index["picks"][task]["bundle"])
    assert served.task_model == task
    seed = served.tasks[task].heads["lp"].seed
    record_dir = head_run_dir(own / "heads" / task, "lp", seed)
    windows = pd.read_parquet(record_dir / HEAD_PREDICTIONS)
    windows = windows[windows["split"] == "dev"]
    order = pd.read_parquet(run / "tokens" / task / "dev.parquet", columns=["idx"])["idx"]
    assert windows["idx"].tolist() == order.tolist()  # the predictions' windows in the tokens' order
    head_outputs = np.stack(windows["outputs"].to_numpy())
    bert = np.concatenate(load_logits(own / "ft" / task / "ckpt-1" / BERT_LOGITS)["dev"])
    combined = ensemble_examples(head_outputs, bert, "mean", "classification")

    rows = dev_rows(run, task)
    answers = served_questions(tmp_path / "picked", task, rows)
    names = get_task(task).label_names
    served_labels, alone_differs = [], False
    for idx, answer in zip(rows["idx"], answers):
        mine = (order == idx).to_numpy()
        margins = combined[mine, 0] - combined[mine, 1]
        want = names[int(best_window(combined[mine], np.zeros(int(mine.sum()), dtype=np.int64))[0])]
        got_margin = answer["outputs"][0] - answer["outputs"][1]
        assert answer["head"] == "lp + BERT (mean)"
        assert got_margin == pytest.approx(margins.max(), abs=2e-3)
        assert answer["label"] == want or abs(margins.max()) < 2e-3
        head_margins = head_outputs[mine, 0] - head_outputs[mine, 1]
        alone_differs |= abs(head_margins.max() - got_margin) > 2e-3
        served_labels.append(names.index(answer["label"]))
    assert alone_differs  # BERT's outputs count
    gold = question_gold(rows)
    accuracy = float(np.mean([label == gold[int(i)] for label, i in zip(served_labels, rows["idx"])]))
    recorded = read_json(record_dir / HEAD_METRICS)["ensembles"]["mean"]["dev"]["accuracy"]
    assert accuracy == pytest.approx(recorded, abs=1.5 / len(rows))


def test_an_ensemble_picked_on_the_untouched_encoder_gets_its_own_bundle(
    run, question_checkpoints, tiny_bert, tmp_path
):
    """BERT at checkpoint 0 is the task model's classifier as fine-tuning initialised it: the
    ensemble needs that task's model, so its bundle is its own, not the shared frozen one."""
    from safetensors.numpy import load_file

    task = "squad2-answerable"
    index = picked_ensemble(run, question_checkpoints, tiny_bert, tmp_path / "picked", task, fraction=0.0)
    assert index["picks"][task]["bundle"] == "squad2-answerable-ft1-ckpt-0"
    assert sorted(index["bundles"]) == ["squad2-answerable-ft1-ckpt-0"]
    served = load_bundle(tmp_path / "picked" / "squad2-answerable-ft1-ckpt-0")
    assert served.task_model == task
    kept = load_file(served.encoder_dir / "model.safetensors")
    initial = load_file(question_checkpoints / "ft" / task / "ckpt-0" / "model.safetensors")
    classifier = [k for k in initial if k.startswith("classifier.")]
    assert classifier and all(np.array_equal(kept[k], initial[k]) for k in classifier)


def test_the_onnx_backends_answer_as_pytorch_does(bundle, tmp_path, monkeypatch):
    """Every kind of task (a joint pair, a pair encoded apart, a regression, spans, answerability)
    through the engine on ONNX Runtime: fp32 gives PyTorch's answers; and a server started with
    backend onnx-int8 answers over HTTP."""
    from bertvision.serving.app import ServeSettings, create_app
    from bertvision.serving.engine import Engine
    from bertvision.serving.items import QuestionItem, TextItem

    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))
    picked = {task: entry.picked for task, entry in bundle.tasks.items()}
    pairs = {task: picked[task] for task in ("mrpc", "rte", "stsb")}
    texts = [
        TextItem(("A man is playing a guitar.", "A man plays the guitar."), pairs),
        TextItem(("Stocks fell.", "The market rose on Friday."), pairs),
    ]
    asked = {task: picked[task] for task in ("squad2", "squad2-answerable")}
    questions = [QuestionItem("Who plays?", "A man plays the guitar in the park.", asked)]
    answers = {}
    for backend in ("torch", "onnx"):
        engine = Engine(bundle, "cpu", backend=backend)
        answers[backend] = engine.predict(texts, questions)
        assert engine.backend == backend
    (torch_texts, torch_questions), (onnx_texts, onnx_questions) = answers["torch"], answers["onnx"]
    for want, got in zip(torch_texts, onnx_texts):
        for task in want:
            assert got[task].label == want[task].label
            np.testing.assert_allclose(got[task].outputs, want[task].outputs, rtol=1e-3, atol=1e-3)
    for want, got in zip(torch_questions, onnx_questions):
        assert got["squad2"].answer == want["squad2"].answer
        assert got["squad2-answerable"].label == want["squad2-answerable"].label

    # int8 weights move the [CLS] states, which barely vary: served where the picks read the mean
    mean_picks = tmp_path / "mean-picks"
    shutil.copytree(bundle.root, mean_picks)
    index = json.loads((mean_picks / "bundle.json").read_text())
    index["tasks"]["stsb"]["picked"] = "lpm"
    (mean_picks / "bundle.json").write_text(json.dumps(index))
    settings = ServeSettings(device="cpu", backend="onnx-int8")
    with Server(create_app(mean_picks, settings)) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        response = client.post("/predict", json={"texts": [["A man is playing a guitar.", "A man plays the guitar."]]})
        left_out = client.post("/predict", json={"texts": ["Stocks fell."], "heads": {"stsb": "lp"}})
    assert response.status_code == 200, response.text
    assert set(response.json()["predictions"][0]) == {"mrpc", "rte", "stsb"}
    assert left_out.status_code == 422 and "task stsb has no head 'lp'; its heads: lpm" in left_out.text


def test_a_backend_that_moves_a_picked_heads_answers_is_refused_in_one_line(bundle, tmp_path, monkeypatch):
    """int8 weights move a first layer's [CLS] state, the same for every text, by thousands of its
    spread: the heads that read it (lp, ad8) answered one class for every text, while the heads
    that read the mean or every token barely move. A pick among the first is refused."""
    import subprocess
    import sys

    from bertvision.runtime.backend import with_backend
    from bertvision.serving.backend_check import MOVED_LIMIT, moved_outputs
    from bertvision.serving.engine import Engine

    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))
    served = subprocess.run(
        [sys.executable, "-m", "bertvision", "serve", str(bundle.root), "--backend", "onnx-int8", "--port", "0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = [line for line in served.stderr.splitlines() if ": error: " in line]
    assert served.returncode == 2 and len(errors) == 1, served.stderr[-2000:]
    assert "--backend onnx-int8 moves the answers of stsb/lp by " in errors[0]
    assert errors[0].endswith("serve it with --backend torch, which its heads were trained on")

    engine = Engine(bundle, "cpu")
    reference = engine.encoder
    engine.encoder = with_backend(reference, "onnx-int8")
    moved = moved_outputs(engine, reference, bundle.precision)
    reads_cls = {("mrpc", "lp"), ("rte", "lp"), ("stsb", "lp"), ("stsb", "ad8")}
    assert all(moved[key] > 10 * MOVED_LIMIT for key in reads_cls), moved
    assert all(v < MOVED_LIMIT / 5 for key, v in moved.items() if key not in reads_cls), moved
    assert {task for task, _ in moved} == {"mrpc", "rte", "stsb"}  # question tasks are not probed


def test_a_bundle_serves_on_the_backend_its_heads_states_came_from(run, tiny_bert, tmp_path, monkeypatch):
    """Heads trained on states from ONNX Runtime with int8 weights (their records say so): the
    bundle records that backend and the service runs it unless told otherwise; heads of two
    backends cannot share a bundle's one encoder."""
    from bertvision.serving.engine import Engine

    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path / "cache"))
    heads = {}
    for task, backend in (("mrpc", "onnx-int8"), ("stsb", "torch")):
        heads[task] = tmp_path / "heads" / task
        shutil.copytree(run / "heads" / task, heads[task])
        for metrics in heads[task].rglob(HEAD_METRICS):
            record = read_json(metrics)
            metrics.write_text(json.dumps({**record, "states_backend": backend}))
    keys = {"backbone": "tiny", "encoder": "ft1/ckpt-1", "ft_seed": 1}
    encoder = run / "ft" / "ckpt-1"
    one = {"mrpc": {"heads_dirs": [heads["mrpc"]], "max_length": 64}}
    bundle = write_bundle(tmp_path / "int8", encoder, str(tiny_bert), one, keys, "fp32")
    assert bundle.backend == "onnx-int8" and load_bundle(bundle.root).backend == "onnx-int8"
    assert Engine(bundle, "cpu").backend == "onnx-int8" and Engine(bundle, "cpu", backend="torch").backend == "torch"
    both = {**one, "stsb": {"heads_dirs": [heads["stsb"]], "max_length": 64}}
    with pytest.raises(BundleError, match=r"several backends \(onnx-int8, torch\)"):
        write_bundle(tmp_path / "mixed", encoder, str(tiny_bert), both, keys, "fp32")


def test_a_request_at_each_limit_is_answered_and_questions_count_toward_the_inputs(server):
    """Exactly max_texts inputs and exactly max_text_chars characters are within the limits (a
    limit counted with >= refused them); questions count as inputs as texts do."""
    at_limit = post(server, {"texts": [PAIR] * MAX_TEXTS, "tasks": ["mrpc"]})
    assert at_limit.status_code == 200 and len(at_limit.json()["predictions"]) == MAX_TEXTS, at_limit.text
    longest = post(server, {"texts": [["x " * (MAX_CHARS // 2), "y"]], "tasks": ["mrpc"]})
    assert longest.status_code == 200, longest.text
    question = {"question": "Who sat?", "context": "The cat sat."}
    too_many = post(server, {"qa": [question] * (MAX_TEXTS + 1)})
    assert too_many.status_code == 413 and too_many.json()["field"] == "qa", too_many.text
    body = json.dumps({"texts": [PAIR], "tasks": ["mrpc"]}).encode()
    headers = {"content-type": "application/json"}
    for padding, status in ((MAX_BODY - len(body), 200), (MAX_BODY - len(body) + 1, 413)):  # bytes: the body limit
        response = server.client.post("/predict", content=body + b" " * padding, headers=headers)
        assert response.status_code == status, response.text


def test_an_input_the_native_api_answers_with_422_is_a_400_under_v2(server):
    """The protocol's one status for a bad request: the shared checks' 422 (an empty text) is a 400 there."""
    body = {"inputs": [text_tensor("text_a", ["\u200b"]), text_tensor("text_b", ["b"])]}
    response = v2_post(server, "mrpc", body)
    assert response.status_code == 400 and response.json()["field"] == "inputs.text_a[0]", response.text


def test_a_key_given_twice_in_a_body_is_refused_in_each_api(server):
    """json keeps the last of two equal keys silently: {"texts": [a], "texts": [b]} answered b alone."""
    for path, content, expected in (
        ("/predict", b'{"texts": [["a", "b"]], "texts": [["c", "d"]], "tasks": ["mrpc"]}', "'texts'"),
        ("/predict", b'{"qa": [{"question": "q", "question": "r", "context": "c"}]}', "'question'"),
        ("/v2/models/mrpc/infer", b'{"inputs": [], "inputs": []}', "'inputs'"),
    ):
        response = server.client.post(path, content=content, headers={"content-type": "application/json"})
        assert response.status_code == 400 and response.json()["field"] == "body", response.text
        message = response.json()["detail" if path == "/predict" else "error"]
        assert message.endswith(f"key {expected} given twice in one object; give each key once"), message
