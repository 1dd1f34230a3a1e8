"""Zero-storage mode (``store: false``): heads trained on states the frozen checkpoint computes in
the head job give the answers of heads trained on the stored features, and write no feature
bytes. Real data (the shipped MRPC and SQuAD 2.0 files), a real tiny BERT, the real stages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings, HeadRuntimeSettings, HeadTrainingSettings
from bertvision.features.source import StreamSource
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.features.streamed import open_split
from bertvision.layout import HEAD_METRICS, head_run_dir
from bertvision.registry.task_spec import splits_of
from bertvision.registry.tasks import get_task
from bertvision.stages.download import download_task
from bertvision.stages.extract import extract_shard
from bertvision.stages.tokenize import tokenize_task
from bertvision.stages.train_heads import train_heads
from tests.conftest import workflow_settings
from tests.stages import with_training

SETTINGS = HeadTrainingSettings(
    learning_rate=5e-3,
    batch_size=16,
    max_epochs=3,
    patience=2,
    weight_decay=0.01,
    warmup_ratio=0.1,
    in_memory_max_mb=4096,
    standardize=True,
)
RUNTIME = HeadRuntimeSettings(device="cpu", verify="sha256")
EXTRACT = ExtractSettings(batch_size=16, block_rows=64, block_tokens=4096)
COMPUTE = ExtractCompute(device="cpu", precision="fp32", backend="torch")
HEADS = {
    "mrpc": {
        "lp": {"type": "lp"},
        "lp-mean": {"type": "lp", "reads": "mean"},
        "adapter8": {"type": "adapter", "width": 8},
        "tokpool": {"type": "token-pool"},
        "ladder": {"type": "ladder", "reduction": 4, "attention_heads": 2},
    },
    "squad2": {
        "lp": {"type": "lp"},
        "adapter8": {"type": "adapter", "width": 8},
        "ladder": {"type": "ladder", "reduction": 4, "attention_heads": 2},
    },
}
TASKS = {
    "mrpc": {"train_size": 120, "eval_size": 60, "max_length": 64, "token_features": True},
    "squad2": {
        "article_split": {"from": "dev", "train": 0.6, "selection": 0.1, "dev": 0.3},
        "train_size": 40,
        "selection_size": 20,
        "eval_size": 30,
        "max_length": 128,
        "doc_stride": 64,
    },
}


def attrs_of(task: str) -> dict:
    kind = get_task(task).kind
    return {
        "model": "tiny",
        "task": task,
        "checkpoint": "1",
        "ft_seed": 1,
        "label_kind": kind,
        **({"features": "tokens"} if kind != "span" else {}),
    }


@pytest.fixture(scope="module", params=["mrpc", "squad2"])
def prepared(request, tiny_bert, tmp_path_factory):
    """The task tokenized for the tiny BERT; its features stored (2 shards) in one directory,
    the tokens alone in another (what a streamed run has)."""
    task = request.param
    root = tmp_path_factory.mktemp(task)
    settings = workflow_settings(backbones={"tiny": {"pretrained": str(tiny_bert)}}, tasks={task: TASKS[task]})
    download_task(get_task(task), settings.download(task), root / "raw")
    tokenize_task(get_task(task), settings.tokenize("tiny", task), root / "raw", root / "tokens")
    shards = [root / "features" / f"shard-{i}-of-2" for i in range(2)]
    for i, d in enumerate(shards):
        extract_shard(
            tiny_bert, root / "tokens", d, i, 2, splits_of(get_task(task)), EXTRACT, COMPUTE, attrs_of(task), threads=1
        )
    write_manifest(shards, root / "features" / "manifest.json", splits_of(get_task(task)))
    return task, root, tiny_bert


def stream_source(task, root, checkpoint) -> StreamSource:
    return StreamSource(str(checkpoint), str(root / "tokens"), EXTRACT, COMPUTE, attrs_of(task))


def trained(task, root, source, out, seeds=(1,), settings=SETTINGS):
    train_heads(
        get_task(task),
        with_training(HEADS[task], settings),
        RUNTIME,
        source,
        list(seeds),
        out,
        threads=1,
        raw_dir=root / "raw",
    )
    return {
        (name, seed): json.loads((head_run_dir(out, name, seed) / HEAD_METRICS).read_text())
        for name in HEADS[task]
        for seed in seeds
    }


def files_under(path):
    return {p: p.stat().st_size for p in path.rglob("*") if p.is_file()}


def test_streamed_heads_match_stored_heads_and_store_nothing(prepared, tmp_path):
    task, root, checkpoint = prepared
    stored = trained(task, root, root / "features" / "manifest.json", tmp_path / "stored")
    before = files_under(root)
    streamed = trained(task, root, stream_source(task, root, checkpoint), tmp_path / "streamed")
    assert files_under(root) == before  # the task's directory gained no file: no features, no cache
    written = files_under(tmp_path / "streamed")
    assert written and not [p for p in written if p.suffix in (".h5", ".npy", ".tmp")]
    metric = get_task(task).primary_metric
    for key, want in stored.items():
        got = streamed[key]
        assert got["features_stored"] is False and want["features_stored"] is True
        assert got["stream"]["encoder_sequences"] > 0 and got["stream"]["runs_per_pass"] == len(HEADS[task])
        assert got["best_epoch"] == want["best_epoch"], key
        # Float16 states either way, in the same batch order; only the padding of the encoder's
        # batches differs (length-sorted when extracting, shuffled when streaming), which in fp32
        # on a CPU changes nothing here. Tolerance: one dev example (the metrics), 1e-5 (losses).
        for split in ("selection", "dev"):
            assert got["metrics"][split][metric] == pytest.approx(want["metrics"][split][metric], abs=0.02), key
        np.testing.assert_allclose(
            [h["train_loss"] for h in got["history"]], [h["train_loss"] for h in want["history"]], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("prepared", ["mrpc"], indirect=True)
def test_every_head_and_seed_trains_on_one_pass_and_the_first_seed_keeps_its_order(prepared, tmp_path):
    task, root, checkpoint = prepared
    stored = trained(task, root, root / "features" / "manifest.json", tmp_path / "stored", seeds=(1, 2))
    streamed = trained(task, root, stream_source(task, root, checkpoint), tmp_path / "streamed", seeds=(1, 2))
    runs = len(HEADS[task]) * 2
    # [CLS] heads, mean heads and the token head read different batches (problems): one pass each per epoch
    assert {r["stream"]["runs_per_pass"] for r in streamed.values()} == {runs}
    sequences = streamed["lp", 1]["stream"]["encoder_sequences"]
    n_train = streamed["lp", 1]["train_examples"]
    n_held = sum(len(pd.read_parquet(root / "tokens" / f"{s}.parquet")) for s in ("selection", "dev"))
    # per problem: one pass for the input moments + one per epoch + the held splits once
    assert sequences == 3 * (n_train * (1 + SETTINGS.max_epochs) + n_held)

    def losses(record):
        return [h["train_loss"] for h in record["history"]]

    for name in HEADS[task]:
        np.testing.assert_allclose(losses(streamed[name, 1]), losses(stored[name, 1]), rtol=1e-5, atol=1e-6)
        # seed 2 shares seed 1's batch order when streamed: its own initialization, another run
        assert losses(streamed[name, 2]) != losses(streamed[name, 1])


def test_held_splits_recomputed_when_they_do_not_fit_give_the_same_answers(prepared, tmp_path):
    task, root, checkpoint = prepared
    source = stream_source(task, root, checkpoint)
    kept = trained(task, root, source, tmp_path / "kept")
    recomputed = trained(task, root, source, tmp_path / "recomputed", settings=SETTINGS.replace(in_memory_max_mb=0))
    for key, want in kept.items():
        assert recomputed[key]["metrics"] == want["metrics"], key
        assert recomputed[key]["stream"]["encoder_sequences"] > want["stream"]["encoder_sequences"]


# --- the config ------------------------------------------------------------------------------
def test_store_is_per_run_with_per_task_overrides():
    settings = workflow_settings(tasks={"mrpc": None, "rte": {"store": False}})
    assert settings.store("mrpc") and not settings.store("rte")
    runs = {r.task: r.stored for r in settings.runs()}
    assert runs == {"mrpc": True, "rte": False}
    everything = workflow_settings(tasks={"mrpc": None, "rte": {"store": True}}, extract={"store": False})
    assert not everything.store("mrpc") and everything.store("rte")


def test_a_streamed_task_cannot_be_shared():
    from bertvision.errors import ConfigError

    with pytest.raises(ConfigError, match=r"shared.tasks: \['rte'\] stream their states \(store: false\)"):
        workflow_settings(tasks={"mrpc": None, "rte": {"store": False}}, shared={"tasks": ["mrpc", "rte"]})


def test_the_stream_source_round_trips_through_the_command_line():
    from bertvision.features.source import feature_source

    source = stream_source("squad2", Path("/x"), "/ckpt")
    assert feature_source(source.to_json()) == source and source.level == "tokens"
    assert feature_source(f"  {source.to_json()}") == source  # as a shell line may pass it
    assert str(feature_source("features/m/t/ft1/ckpt-1/manifest.json")).endswith("manifest.json")


def test_a_streamed_split_holds_in_memory_what_the_stored_one_holds(prepared):
    """``held_bytes``, what a streamed split's states take held in memory (float16), decides
    whether it is computed once or at every read: the bytes of the stored split's token states."""
    task, root, tiny_bert = prepared
    for split in ("train", "dev"):
        stored = FeatureSet.open(root / "features" / "manifest.json", split).read_windows()
        streamed = open_split(stream_source(task, root, tiny_bert), split)
        assert streamed.held_bytes() == stored.states.nbytes > 0, split


def test_a_streamed_view_of_some_windows_computes_those_rows(prepared):
    """A lazy view of some rows (``windows(rows)``, a view's ``subset``) computes the rows it was
    given, as the stored split holds them: the rows of the split, not of the view's own count."""
    task, root, tiny_bert = prepared
    stored = FeatureSet.open(root / "features" / "manifest.json", "train").read_windows()
    streamed = open_split(stream_source(task, root, tiny_bert), "train")
    for view, row, want in (
        (streamed.windows(np.array([5, 2])), 0, 5),
        (streamed.windows(np.array([7, 5, 2])).subset(np.array([2, 1])), 1, 5),
    ):
        x, mask, labels = view.padded(np.array([row]))
        x_stored, mask_stored, labels_stored = stored.padded(np.array([want]))
        assert torch.equal(mask, mask_stored) and torch.equal(labels, labels_stored)
        np.testing.assert_allclose(x[mask].numpy(), x_stored[mask_stored].numpy(), atol=2e-2)


def test_the_disk_check_plans_the_bytes_a_shard_stores(prepared, tmp_path, caplog):
    """The bytes an extraction checks the disk for are the float16 states its shard then holds
    (every split's [CLS], mean or token rows), not a fraction or a multiple of them."""
    import logging
    import re

    import h5py

    task, root, tiny_bert = prepared
    out = tmp_path / "shard-1-of-2"
    with caplog.at_level(logging.INFO, logger="bertvision.features.disk_plan"):
        extract_shard(tiny_bert, root / "tokens", out, 1, 2, splits_of(get_task(task)), EXTRACT, COMPUTE,
                      attrs_of(task), threads=1)  # fmt: skip
    planned = int(re.search(r"planned feature bytes for this shard: ([\d,]+)", caplog.text).group(1).replace(",", ""))
    stored = 0
    for path in out.glob("*.h5"):
        with h5py.File(path) as f:
            stored += sum(d.nbytes for d in (f[n] for n in f) if isinstance(d, h5py.Dataset) and d.dtype == np.float16)
    assert planned == stored > 0
