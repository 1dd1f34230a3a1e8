"""Stored token-level features read lazily (``features.token_reader``): the lazy view answers as
the in-memory one on the same shards; training on it, with one buffer, gives exactly the
in-memory results (token-pool on example tasks, lp and ladder on real SQuAD windows); and a split many
times larger than ``heads.training.in_memory_max_mb`` trains within a small multiple of it,
measured (tracemalloc traces every numpy array: reads, buffers, padded batches)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings
from bertvision.data.tokenized import bucketed_batches, shuffled_batches
from bertvision.features.shard_writer import TokenShardWriter, shard_rows
from bertvision.features.store import FeatureSet, WindowStates, write_manifest
from bertvision.features.token_reader import StoredWindows, token_windows
from bertvision.registry.task_spec import splits_of
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
from bertvision.training.loop import train_one
from bertvision.training.span import SpanProblem
from bertvision.training.statistics import token_moments
from bertvision.training.tokens import TokenExampleProblem
from tests.stages import with_training
from tests.test_token_head import RUNTIME
from tests.test_token_head import SETTINGS as TOKEN_HEAD_SETTINGS

SETTINGS = TOKEN_HEAD_SETTINGS.replace(max_epochs=3, patience=3)
MiB = 2**20


def write_token_features(root, sizes: dict, layers: int, hidden: int, n_shards: int, span: bool = False, seed=0):
    """Token shards as extraction writes them: per example (or window) 4..16 tokens of noise;
    one token (never the first) carries a marker (layer 2, dim 1) and the label (layer 2,
    dim 0). ``span``: windows with character offsets and (start, end) labels instead."""
    rng = np.random.default_rng(seed)
    for split, n in sizes.items():
        lengths = rng.integers(4, 17, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        states = rng.standard_normal((int(offsets[-1]), layers, hidden), dtype=np.float32)
        marked = offsets[:-1] + rng.integers(1, lengths)
        if span:
            labels = np.stack([marked - offsets[:-1]] * 2, axis=1).astype(np.int64)
            char_offsets = rng.integers(-1, 500, (int(offsets[-1]), 2)).astype(np.int32)
        else:
            labels = rng.integers(0, 2, n)
            states[:, 2, 1] -= 3.0
            states[marked, 2, 1] = 6.0
            states[marked, 2, 0] = 2.0 * (2 * labels - 1) + 0.2 * rng.standard_normal(n)
        for shard in range(n_shards):
            a, b = shard_rows(n, n_shards, shard)
            attrs = {
                "model": "m",
                "task": "squad2" if span else "sst2",
                "checkpoint": "1",
                "ft_seed": 1,
                "split": split,
                "label_kind": "span" if span else "classification",
                "encoder_parameters": 10_000,
                "row_start": a,
                "row_end": b,
                "split_rows": n,
                **({} if span else {"features": "tokens"}),
            }
            t0, t1 = offsets[a], offsets[b]
            with TokenShardWriter(
                root / f"shard-{shard}-of-{n_shards}" / f"{split}.h5",
                lengths[a:b],
                layers,
                hidden,
                attrs,
                **({} if span else {"label_shape": (), "label_dtype": labels.dtype, "store_cls": True}),
                char_offsets=span,
            ) as w:
                w.write_windows(0, states[t0:t1], char_offsets[t0:t1] if span else None, labels[a:b], np.arange(a, b))
    write_manifest(sorted(root.glob("shard-*")), root / "manifest.json", list(sizes))
    return root / "manifest.json"


def assert_batches_equal(a, b):
    for x, y in zip(a, b, strict=True):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))


def peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()


# --- the lazy view answers as the in-memory one ----------------------------------------------
@pytest.mark.parametrize("span", [False, True], ids=["examples", "span-windows"])
def test_the_lazy_view_reads_what_the_in_memory_view_holds(tmp_path, span):
    manifest = write_token_features(tmp_path, {"train": 1200}, layers=4, hidden=64, n_shards=3, span=span)
    features = FeatureSet.open(manifest, "train")
    held = features.read_windows()
    lazy = StoredWindows.open(features, in_memory_max_mb=2)  # 6 MiB of states, 3 shards
    assert len(lazy) == len(held) == 1200
    assert (lazy.lengths == held.lengths).all() and (lazy.labels == held.labels).all()
    assert (lazy.idx == held.idx).all()
    if span:
        assert all((a == b).all() for a, b in zip(lazy.offsets, held.offsets, strict=True))
    else:
        assert lazy.offsets is None and held.offsets is None

    rows = np.array([1199, 3, 400, 401, 402, 3, 799, 800, 0])  # unsorted, across shards, repeated
    assert_batches_equal(lazy.padded(rows), held.padded(rows))
    some = np.flatnonzero(np.random.default_rng(1).random(1200) < 0.3)
    lazy_some, held_some = lazy.subset(some), held.subset(some)
    assert isinstance(lazy_some, StoredWindows) and isinstance(held_some, WindowStates)
    assert_batches_equal(lazy_some.padded(np.arange(20)), held_some.padded(np.arange(20)))
    assert (lazy_some.idx == held.idx[some]).all()
    if span:
        assert all((a == b).all() for a, b in zip(lazy_some.offsets, held_some.offsets, strict=True))

    np.testing.assert_array_equal(np.concatenate(list(lazy.token_chunks())), held.states)
    for view, memory in ((lazy, held), (lazy_some, held_some)):  # the same float64 sums, bit for bit
        for got, want in zip(token_moments(view, "cpu"), token_moments(memory, "cpu"), strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("make_batches", [bucketed_batches, shuffled_batches], ids=["bucketed", "shuffled"])
def test_one_buffer_gives_the_in_memory_batches_and_small_buffers_cover_the_split(tmp_path, make_batches):
    manifest = write_token_features(tmp_path, {"train": 1200}, layers=4, hidden=64, n_shards=3)
    features = FeatureSet.open(manifest, "train")
    held = features.read_windows()
    whole = StoredWindows.open(features, in_memory_max_mb=1024)
    assert_batches_equal(
        [t for batch in whole.training_batches(8, 7, make_batches) for t in batch],
        [t for batch in held.training_batches(8, 7, make_batches) for t in batch],
    )
    assert_batches_equal(
        [t for batch in whole.inference_batches(300) for t in batch],
        [t for batch in held.inference_batches(300) for t in batch],
    )

    small = StoredWindows(whole.split, in_memory_max_mb=2)  # buffers of ~200 of the 1200 rows

    first_tokens = {held.states[start].tobytes(): i for i, start in enumerate(held.window_offsets[:-1])}

    def epoch(seed):
        """Each batch's rows, found by their first token's states (random, so unique)."""
        batches = []
        for x, mask, y in small.training_batches(8, seed, make_batches):
            rows = [first_tokens[x[j, 0].numpy().astype(np.float16).tobytes()] for j in range(len(x))]
            assert (mask.sum(1).numpy() == held.lengths[rows]).all() and (y.numpy() == held.labels[rows]).all()
            assert_batches_equal(held.padded(np.array(rows)), (x, mask, y))
            batches.append(rows)
        return batches

    first, again, other = epoch(3), epoch(3), epoch(4)
    assert first == again and first != other
    assert sorted(r for b in first for r in b) == list(range(1200))  # every row once
    assert len(first) == 1200 // 8 and {len(b) for b in first} == {8}  # as many steps as in memory
    # shuffled across the whole split, not buffer by buffer in file order
    assert np.corrcoef(np.arange(len(first)), [np.mean(b) for b in first])[0, 1] < 0.5

    # 6 MiB of states, read within the 2 MiB bound (the padded batches made one at a time here)
    assert peak_mib(lambda: sum(1 for _ in small.training_batches(8, 3, make_batches))) < 2
    assert peak_mib(lambda: sum(1 for _ in small.inference_batches(300))) < 2

    seen = {}
    for rows, x, mask in small.inference_batches(300):
        assert mask.sum() <= 300 or len(rows) == 1
        for j, r in enumerate(rows):
            seen[int(r)] = x[j, mask[j]]
    assert sorted(seen) == list(range(1200))
    for r in (0, 399, 400, 1199):
        assert torch.equal(seen[r], torch.from_numpy(held.states[held.window(r)].astype(np.float32)))


# --- training on the lazy view gives the in-memory results -------------------------------------
def trained_token_head(manifest, lazy: bool, train_fraction: float = 1.0):
    task = get_task("sst2")
    feats = {split: FeatureSet.open(manifest, split) for split in splits_of(task)}
    problem = TokenExampleProblem(task, feats, torch.device("cpu"), 4096, train_fraction=train_fraction, lazy=lazy)
    assert problem.data_in_memory is not lazy
    moments = problem.moments()
    head, best, history, _ = train_one(task, {"type": "token-pool"}, SETTINGS, problem, 1, torch.device("cpu"), moments)
    metrics, predictions, _ = problem.evaluate(head)
    return moments, best["epoch"], history, metrics, predictions


@pytest.mark.parametrize("train_fraction", [1.0, 0.5])
def test_token_head_on_the_lazy_view_trains_exactly_as_in_memory(tmp_path, train_fraction):
    sizes = {"train": 600, "selection": 150, "dev": 200}
    manifest = write_token_features(tmp_path, sizes, layers=4, hidden=16, n_shards=3)
    in_memory = trained_token_head(manifest, lazy=False, train_fraction=train_fraction)
    lazy = trained_token_head(manifest, lazy=True, train_fraction=train_fraction)
    for got, want in zip(lazy[0], in_memory[0], strict=True):
        assert torch.equal(got, want)
    assert lazy[1:4] == in_memory[1:4]  # best epoch, every epoch's loss and selection metrics, dev metrics
    pd.testing.assert_frame_equal(lazy[4], in_memory[4])


@pytest.fixture(scope="module")
def squad_features(tiny_bert, tmp_path_factory):
    """Real SQuAD 2.0 windows (the shipped dev file), tokenized for the tiny BERT and extracted
    into 2 shards."""
    from bertvision.stages.download import download_task
    from bertvision.stages.extract import extract_shard
    from bertvision.stages.tokenize import tokenize_task
    from tests.conftest import squad_slice, workflow_settings

    root = tmp_path_factory.mktemp("squad2")
    task = get_task("squad2")
    settings = workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={"squad2": squad_slice(40, 20, 30, max_length=128, doc_stride=64)},
    )
    download_task(task, settings.download("squad2"), root / "raw")
    tokenize_task(task, settings.tokenize("tiny", "squad2"), root / "raw", root / "tokens")
    shards = [root / "features" / f"shard-{i}-of-2" for i in range(2)]
    attrs = {"model": "tiny", "task": "squad2", "checkpoint": "1", "ft_seed": 1, "label_kind": "span"}
    for i, d in enumerate(shards):
        extract_shard(
            tiny_bert,
            root / "tokens",
            d,
            i,
            2,
            splits_of(task),
            ExtractSettings(batch_size=16, block_rows=64, block_tokens=4096),
            ExtractCompute(device="cpu", precision="fp32", backend="torch"),
            attrs,
            threads=1,
        )
    write_manifest(shards, root / "features" / "manifest.json", splits_of(task))
    return root


@pytest.mark.parametrize(
    "spec, train_fraction",
    [
        ({"type": "lp"}, 1.0),
        ({"type": "lp"}, 0.5),
        ({"type": "ladder", "reduction": 4, "attention_heads": 2}, 1.0),
    ],
    ids=["lp", "lp-half", "ladder"],
)
def test_span_head_on_the_lazy_view_trains_exactly_as_in_memory(squad_features, spec, train_fraction):
    task = get_task("squad2")
    feats = {split: FeatureSet.open(squad_features / "features" / "manifest.json", split) for split in splits_of(task)}
    results = []
    for lazy in (False, True):
        problem = SpanProblem(task, feats, torch.device("cpu"), 4096, squad_features / "raw", train_fraction, lazy=lazy)
        assert problem.data_in_memory is not lazy
        assert all(isinstance(w, StoredWindows if lazy else WindowStates) for w in problem.windows.values())
        moments = problem.moments()
        head, best, history, _ = train_one(task, spec, SETTINGS, problem, 1, torch.device("cpu"), moments)
        metrics, predictions, _ = problem.evaluate(head)
        results.append((moments, best["epoch"], history, metrics, predictions))
    (in_memory, lazy) = results
    for got, want in zip(lazy[0], in_memory[0], strict=True):
        assert torch.equal(got, want)
    assert lazy[1:4] == in_memory[1:4]
    pd.testing.assert_frame_equal(lazy[4], in_memory[4])


# --- the bound -------------------------------------------------------------------------------
def test_which_splits_are_held_follows_the_bound(tmp_path):
    manifest = write_token_features(tmp_path, {"train": 400, "selection": 100, "dev": 100}, 4, 64, n_shards=2)
    feats = {split: FeatureSet.open(manifest, split) for split in ("train", "selection", "dev")}
    nbytes = {split: int(fs.read_windows().states.nbytes) for split, fs in feats.items()}

    def kinds(mb, lazy=False):
        return {split: type(view).__name__ for split, view in token_windows(feats, mb, lazy).items()}

    everything = sum(nbytes.values()) / MiB
    assert set(kinds(everything).values()) == {"WindowStates"}
    assert set(kinds(everything, lazy=True).values()) == {"StoredWindows"}
    # train first; then what the bound still has room for
    fits_train = (nbytes["train"] + nbytes["selection"]) / MiB
    assert kinds(fits_train) == {"train": "WindowStates", "selection": "WindowStates", "dev": "StoredWindows"}
    assert kinds(nbytes["selection"] / MiB) == {
        "train": "StoredWindows",
        "selection": "WindowStates",
        "dev": "StoredWindows",
    }


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_a_split_four_times_the_bound_trains_within_a_small_multiple_of_it(tmp_path):
    """64 MiB of training states (float16) and a 16 MiB bound: the lazy reader's peak stays
    under twice the bound (held-out splits held in it, the reader's buffer and float32 batches,
    the input moments' sums); the in-memory path on the same split goes above the split."""
    sizes = {"train": 6600, "selection": 300, "dev": 300}
    manifest = write_token_features(tmp_path / "features", sizes, layers=8, hidden=64, n_shards=4)
    split_mib = FeatureSet.open(manifest, "train").read_windows().states.nbytes / MiB
    bound = 16
    assert split_mib >= 4 * bound
    settings = SETTINGS.replace(batch_size=32, max_epochs=2, in_memory_max_mb=bound)
    heads = {"tokens": {"type": "token-pool"}}

    def train(out, training):
        return lambda: train_heads(
            get_task("sst2"), with_training(heads, training), RUNTIME, manifest, [1], out, threads=1
        )

    # in memory first: the modules training imports on first use (torch's optimizers, the
    # metrics) are then loaded before the lazy run is measured
    held_peak = peak_mib(train(tmp_path / "held", settings.replace(in_memory_max_mb=4096)))
    lazy_peak = peak_mib(train(tmp_path / "lazy", settings))
    records = {
        name: json.loads((tmp_path / name / "tokens" / "seed1" / "metrics.json").read_text())
        for name in ("lazy", "held")
    }
    print(f"split {split_mib:.1f} MiB, bound {bound} MiB: peak {lazy_peak:.1f} MiB lazy, {held_peak:.1f} MiB held")
    assert records["lazy"]["data_in_memory"] is False and records["held"]["data_in_memory"] is True
    assert lazy_peak < 2 * bound
    assert held_peak > split_mib
    for name in ("lazy", "held"):
        assert records[name]["metrics"]["dev"]["accuracy"] > 0.9, records[name]["metrics"]


def test_a_token_shard_refuses_mean_states_it_was_not_made_to_store_or_misses_ones_it_was(tmp_path):
    """Mean states given to a shard made without them, or missing where it stores them, are a
    caller's mistake refused at once, not a shard whose mean rows are left zero."""
    attrs = {"model": "m", "task": "mrpc", "checkpoint": "1", "ft_seed": 1, "split": "dev",
             "label_kind": "classification", "encoder_parameters": 10, "features": "tokens"}  # fmt: skip
    lengths, states = np.array([2, 3]), np.zeros((5, 2, 4), np.float32)
    for store_mean, mean in ((False, np.zeros((2, 2, 4))), (True, None)):
        with pytest.raises(ValueError, match=f"mean states given {mean is not None}, stored {store_mean}"):
            with TokenShardWriter(tmp_path / f"{store_mean}.h5", lengths, 2, 4, attrs, label_shape=(),
                                  store_mean=store_mean, char_offsets=False) as w:  # fmt: skip
                w.write_windows(0, states, None, np.zeros(2), np.arange(2), mean=mean)
        assert not (tmp_path / f"{store_mean}.h5").exists()


@pytest.mark.parametrize("view", ["in memory", "lazy"])
def test_padded_batches_are_float32_holding_the_stored_float16_states(tmp_path, view):
    """``padded`` gives the heads float32 (the stored float16 states, exactly, zeros past each
    window's end), from the in-memory view and the lazy one alike."""
    manifest = write_token_features(tmp_path, {"train": 12}, layers=3, hidden=4, n_shards=2)
    features = FeatureSet.open(manifest, "train")
    held = features.read_windows()
    assert held.states.dtype == np.float16
    rows = np.array([7, 0, 11, 6])  # unsorted, across both shards
    x, mask, y = (held if view == "in memory" else StoredWindows.open(features, in_memory_max_mb=1)).padded(rows)
    assert x.dtype == torch.float32 and mask.dtype == torch.bool
    assert x.shape == (4, int(held.lengths[rows].max()), 3, 4)
    for j, i in enumerate(rows):
        n = int(held.lengths[i])
        assert torch.equal(x[j, :n], torch.from_numpy(held.states[held.window(i)].astype(np.float32)))
        assert not x[j, n:].any() and int(mask[j].sum()) == n and bool(mask[j, :n].all())
    assert torch.equal(y, torch.from_numpy(held.labels[rows]))
