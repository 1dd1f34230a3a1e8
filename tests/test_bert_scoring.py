"""BERT's own head scored from the extraction's pass (rule score_bert): the extraction runs the
checkpoint's task model, stores the very states the bare encoder gives, and keeps the head's
outputs on the scored splits; scoring them gives what a pass of BERT's own gives (the workflow's
way for streamed states), for example and span tasks, over several shards."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pandas as pd
import pytest

from bertvision.evaluation.ensemble import load_logits
from bertvision.layout import (
    BERT_LOGITS,
    BERT_METRICS,
    BERT_PREDICTIONS,
    SHARD_BERT_LOGITS,
    SHARD_BERT_PASS,
    TRAIN_RECORD,
    Checkpoint,
    Run,
    checkpoint_dir,
    shard_file,
)
from bertvision.registry.task_spec import scored_splits, splits_of
from bertvision.registry.tasks import get_task
from tests.conftest import squad_slice, workflow_settings
from tests.stages import download_and_tokenize, fine_tune

SHARDS = 2


def settings_for(tiny_bert):
    sizes = {"train_size": 40, "selection_size": 16, "eval_size": 24}
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={"mrpc": sizes, "stsb": sizes, "squad2": squad_slice(24, 12, 12, max_length=96, doc_stride=32)},
        finetune={"epoch_fractions": [0, 1], "settings": {"batch_size": 8}, "device": "cpu", "precision": "fp32"},
        # a batch size unlike BERT's own evaluation's: other batches, other padding, the same outputs
        extract={"precision": "fp32", "device": "cpu", "batch_size": 5},
    )


def prepared(settings, task, tmp_path):
    """``task``'s raw rows and tokens under tmp_path/raw/TASK and tmp_path/tokens/TASK (the
    layout tests.stages.fine_tune reads)."""
    data = download_and_tokenize(settings, "tiny", task, tmp_path / "data", max_length=settings.max_length(task))
    for kind in ("raw", "tokens"):
        (tmp_path / kind).mkdir()
        shutil.move(data / kind, tmp_path / kind / task)
    return tmp_path


def extract(settings, task, root, ckpt, out, keep_bert_logits):
    from bertvision.stages.extract import extract_shard

    spec = get_task(task)
    for shard in range(SHARDS):
        extract_shard(
            ckpt,
            root / "tokens" / task,
            out / f"shard-{shard}-of-{SHARDS}",
            shard,
            SHARDS,
            list(splits_of(spec)),
            settings.extract(),
            settings.extract_compute(),
            settings.extract_attrs(Run("tiny", task, 1, Checkpoint(1))),
            threads=1,
            keep_bert_logits=keep_bert_logits,
            scored_splits=scored_splits(spec),
        )
    return [out / f"shard-{shard}-of-{SHARDS}" for shard in range(SHARDS)]


SLOW = pytest.mark.slow  # over 10 s each on 2 cores: the fast tier keeps one example task


@pytest.mark.parametrize("task", ["mrpc", pytest.param("stsb", marks=SLOW), pytest.param("squad2", marks=SLOW)])
def test_bert_scored_from_the_extraction_equals_its_own_pass(tiny_bert, tmp_path, task):
    from bertvision.stages.score_bert import score_bert

    settings = settings_for(tiny_bert)
    spec = get_task(task)
    root = prepared(settings, task, tmp_path)
    fine_tune(settings, "tiny", task, root, root / "ft")  # scores BERT at checkpoint 1 by its own pass
    own = checkpoint_dir(root / "ft", Checkpoint(1))
    assert json.loads((own / BERT_METRICS).read_text())["scored_from"] == "own pass"

    with_outputs = extract(settings, task, root, own, root / "with", keep_bert_logits=True)
    plain = extract(settings, task, root, own, root / "plain", keep_bert_logits=False)
    for a, b in zip(with_outputs, plain):
        assert not (b / SHARD_BERT_LOGITS).exists() and not (b / SHARD_BERT_PASS).exists()
        for split in splits_of(spec):  # the task model's states are the bare encoder's, bit for bit
            with h5py.File(shard_file(a, split), "r") as fa, h5py.File(shard_file(b, split), "r") as fb:
                assert sorted(fa) == sorted(fb)
                for name in fa:
                    assert np.array_equal(fa[name][()], fb[name][()]), (split, name)
                assert fa.attrs["encoder_parameters"] == fb.attrs["encoder_parameters"]
        assert sorted(load_logits(a / SHARD_BERT_LOGITS)) == sorted(scored_splits(spec))  # not train

    scored = tmp_path / "from-extraction"
    scored.mkdir()
    for name in (TRAIN_RECORD, "config.json"):
        shutil.copy(own / name, scored / name)
    record = score_bert(spec, settings.finetune_compute(), scored,
                        root / "tokens" / task, root / "raw" / task, shard_dirs=with_outputs)  # fmt: skip
    assert record["scored_from"] == "extraction"
    # BERT's share of the extraction: that pass's seconds on the scored splits of every shard, not train's
    passes = [json.loads((d / SHARD_BERT_PASS).read_text())["seconds"] for d in with_outputs]
    assert all(sorted(p) == sorted(scored_splits(spec)) for p in passes)
    assert record["extraction_pass_seconds"] == pytest.approx(sum(sum(p.values()) for p in passes))
    assert record["extraction_pass_seconds"] > 0
    mine, theirs = (json.loads((d / BERT_METRICS).read_text()) for d in (scored, own))
    for split in scored_splits(spec):
        # other batches, other padding: float32 sums in another order
        assert mine["metrics"][split] == pytest.approx(theirs["metrics"][split], rel=1e-4, abs=1e-4), split
    # what scored it: the extraction's precision (and runtime), which fine-tuning's record does not say
    computed = {json.loads((d / SHARD_BERT_PASS).read_text())["computed_in"] for d in with_outputs}
    assert computed == {mine["scored_in"]} and mine["scored_in"] in ("fp32", "bf16", "fp16")
    scoring_facts = ("metrics", "scored_from", "scoring_seconds", "extraction_pass_seconds", "scored_in")
    assert {k: v for k, v in mine.items() if k not in scoring_facts} == {
        k: v for k, v in theirs.items() if k not in scoring_facts
    }
    a, b = load_logits(scored / BERT_LOGITS), load_logits(own / BERT_LOGITS)
    for split in scored_splits(spec):
        assert len(a[split]) == len(b[split])
        assert all(np.allclose(x, y, atol=1e-5) for x, y in zip(a[split], b[split])), split
    pa, pb = (pd.read_parquet(d / BERT_PREDICTIONS) for d in (scored, own))
    assert list(pa.columns) == list(pb.columns) and len(pa) == len(pb)
    if spec.kind == "classification":
        assert (pa["prediction"] == pb["prediction"]).all()


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_outputs_missing_rows_fail_clearly(tiny_bert, tmp_path):
    from bertvision.errors import FeatureError
    from bertvision.stages.score_bert import score_bert

    settings = settings_for(tiny_bert)
    spec = get_task("mrpc")
    root = prepared(settings, "mrpc", tmp_path)
    fine_tune(settings, "tiny", "mrpc", root, root / "ft")
    own = checkpoint_dir(root / "ft", Checkpoint(1))
    shards = extract(settings, "mrpc", root, own, root / "with", keep_bert_logits=True)
    with pytest.raises(FeatureError, match=r"bert_logits.npz: BERT's outputs on selection cover \d+ rows over 1"):
        score_bert(spec, settings.finetune_compute(), own,
                   root / "tokens" / "mrpc", root / "raw" / "mrpc", shard_dirs=shards[:1])  # fmt: skip


def test_bert_outputs_kept_per_shard_join_in_shard_order(tmp_path):
    """Each shard keeps BERT's outputs on its rows (a window's over its real tokens only); scoring
    joins them in shard order: (N, C) for an example task, one (T, 2) array per window for a span
    task; shards that cover fewer rows than the split fail naming the file."""
    import torch

    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.errors import FeatureError
    from bertvision.features.bert_outputs import HeadOutputs, joined_outputs, save

    windows = TokenizedSplit(pd.DataFrame({
        "input_ids": [[1] * n for n in (3, 5, 4)], "length": [3, 5, 4], "example": [0, 0, 1],
        "start": [0, 1, 0], "end": [0, 2, 0], "offsets": [[0, 0] * n for n in (3, 5, 4)],
    }))  # fmt: skip
    regression = TokenizedSplit(pd.DataFrame({"input_ids": [[1]] * 3, "length": [1] * 3, "idx": [0, 1, 2],
                                              "label": [0.5, 1.0, 2.0]}))  # fmt: skip
    for kind, split, per_batch in (
        ("span", windows, torch.randn(3, 5, 2)),
        ("regression", regression, torch.randn(3, 1)),
    ):
        shards = [tmp_path / kind / f"shard-{i}" for i in range(2)]
        for shard, (start, end) in zip(shards, ((0, 2), (2, 3))):
            kept = HeadOutputs(split, start, end)
            kept.keep(np.arange(start, end), per_batch[start:end])
            shard.mkdir(parents=True)
            save(shard, {"dev": kept}, {"dev": 1.0}, "fp32")
        joined = joined_outputs(shards, {"dev": split}, kind)["dev"]
        if kind == "span":
            assert [w.shape for w in joined] == [(3, 2), (5, 2), (4, 2)]
            for window, want in zip(joined, per_batch):
                np.testing.assert_array_equal(window, want[: len(window)].numpy())
        else:
            np.testing.assert_array_equal(joined, per_batch.numpy())
        with pytest.raises(
            FeatureError, match=r"BERT's outputs on dev cover 2 rows over 1 shard\(s\); the split has 3"
        ):
            joined_outputs(shards[:1], {"dev": split}, kind)
