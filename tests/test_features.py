"""The feature store: round trip, verification, and atomic extraction."""

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertvision.errors import FeatureError
from bertvision.features.shard_writer import ShardWriter, shard_rows
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.features.stream import BatchStream
from tests.conftest import REPO
from tests.stages import BERTVISION, extract_args

ATTRS = {
    "model": "m",
    "task": "mrpc",
    "checkpoint": "0.3",
    "ft_seed": 1,
    "label_kind": "classification",
    "encoder_parameters": 1000,
}


def write_split(root: Path, split: str, data: np.ndarray, labels: np.ndarray, n_shards: int):
    for shard in range(n_shards):
        start, end = shard_rows(len(data), n_shards, shard)
        attrs = {**ATTRS, "split": split, "row_start": start, "row_end": end, "split_rows": len(data)}
        with ShardWriter(
            root / f"shard-{shard}-of-{n_shards}" / f"{split}.h5",
            end - start,
            data.shape[1],
            {"cls": data.shape[2]},
            "int64",
            attrs,
        ) as w:
            w.write_block(0, {"cls": data[start:end]}, labels[start:end], np.arange(start, end) + 100)


@pytest.fixture
def feature_dir(tmp_path):
    rng = np.random.default_rng(0)
    data = {s: rng.normal(size=(n, 3, 8)).astype(np.float16) for s, n in (("train", 50), ("dev", 7))}
    labels = {s: rng.integers(0, 2, len(d)) for s, d in data.items()}
    for split in data:
        write_split(tmp_path, split, data[split], labels[split], n_shards=3)
    shards = sorted(tmp_path.glob("shard-*"))
    write_manifest(shards, tmp_path / "manifest.json", ["train", "dev"])
    return tmp_path, data, labels


def test_round_trip(feature_dir):
    root, data, labels = feature_dir
    for split in data:
        fs = FeatureSet.open(root / "manifest.json", split)
        x, y, idx = fs.read_all()
        assert x.dtype == np.float16 and np.array_equal(x, data[split])
        assert np.array_equal(y, labels[split])
        assert np.array_equal(idx, np.arange(len(x)) + 100)
        assert fs.shape == (3, 8)


def test_stream_visits_every_row_once(feature_dir):
    root, data, labels = feature_dir
    fs = FeatureSet.open(root / "manifest.json", "train")
    stream = BatchStream(fs, batch_size=4, seed=1, buffer_rows=10, block_rows=6)
    xs = np.concatenate([x.numpy() for x, _ in stream])
    assert len(xs) == 50
    key = lambda a: sorted(map(bytes, a.astype(np.float32).reshape(len(a), -1)))  # noqa: E731
    assert key(xs) == key(data["train"].astype(np.float32))
    order_a = np.concatenate([y.numpy() for _, y in BatchStream(fs, 4, seed=1)])
    order_b = np.concatenate([y.numpy() for _, y in BatchStream(fs, 4, seed=2)])
    assert sorted(order_a) == sorted(order_b)


def test_truncated_shard_is_rejected(feature_dir):
    root, _, _ = feature_dir
    path = root / "shard-1-of-3" / "train.h5"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FeatureError, match=r"shard-1-of-3/train.h5: \d+ bytes, the manifest says \d+"):
        FeatureSet.open(root / "manifest.json", "train")


def test_tampered_shard_is_rejected(feature_dir):
    root, _, _ = feature_dir
    path = root / "shard-2-of-3" / "train.h5"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(FeatureError, match=r"sha256 differs"):
        FeatureSet.open(root / "manifest.json", "train")


def corrupt_first_chunk(path: Path, dataset: str = "cls") -> None:
    """Flip a byte inside the first chunk of a shard's [CLS] states, or of another dataset (its
    checksum then fails)."""
    import h5py

    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_chunk_info(0).byte_offset
    raw = bytearray(path.read_bytes())
    raw[offset + 3] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_fletcher32_catches_corrupted_chunk_without_manifest_check(feature_dir):
    root, _, _ = feature_dir
    corrupt_first_chunk(root / "shard-0-of-3" / "train.h5")
    fs = FeatureSet.open(root / "manifest.json", "train", verify="none")
    with pytest.raises(FeatureError, match="unreadable HDF5 shard"):
        fs.read_all()


@pytest.mark.parametrize("verify", ["size", "none"])
def test_a_corrupted_label_is_caught_without_the_digest(feature_dir, verify):
    """Labels and row ids had no checksum: with verify size or none a flipped bit in a label was
    read as another label."""
    root, _, _ = feature_dir
    corrupt_first_chunk(root / "shard-0-of-3" / "train.h5", "labels")
    with pytest.raises(FeatureError, match="unreadable HDF5 shard"):
        FeatureSet.open(root / "manifest.json", "train", verify=verify).read_all()


def test_manifest_refuses_a_gap(tmp_path):
    data = np.zeros((10, 2, 4), np.float16)
    write_split(tmp_path, "train", data, np.zeros(10, int), n_shards=2)
    with pytest.raises(FeatureError, match="starts at row 5, expected 0"):
        write_manifest([tmp_path / "shard-1-of-2"], tmp_path / "manifest.json", ["train"])


def test_shards_given_in_any_order_are_read_in_row_order(tmp_path):
    """By their first row, not by their names (shard-10 sorts before shard-2), nor as given."""
    rng = np.random.default_rng(1)
    data, labels = rng.normal(size=(12, 2, 4)).astype(np.float16), rng.integers(0, 3, 12)
    write_split(tmp_path, "train", data, labels, n_shards=3)
    shards = [tmp_path / f"shard-{i}-of-3" for i in (2, 0, 1)]
    write_manifest(shards, tmp_path / "manifest.json", ["train"])
    features = FeatureSet.open(tmp_path / "manifest.json", "train")
    x, y, idx = features.read_all()
    assert np.array_equal(x, data) and np.array_equal(y, labels) and np.array_equal(idx, np.arange(12) + 100)
    assert np.array_equal(features.labels(), labels)


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FeatureError, match="no manifest; the extraction did not finish"):
        FeatureSet.open(tmp_path / "manifest.json", "train")


def test_failed_writer_leaves_no_file(tmp_path):
    target = tmp_path / "x.h5"
    with pytest.raises(RuntimeError):
        with ShardWriter(target, 4, 2, {"cls": 3}, "int64", {**ATTRS, "split": "train"}) as w:
            w.write_block(0, {"cls": np.zeros((2, 2, 3))}, np.zeros(2), np.zeros(2))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_chunks_tile_the_rows():
    from bertvision.features.shard_writer import chunk_rows

    for n in (1, 100, 900, 1408, 100_000):
        for row_bytes in (5376, 19968, 51200):
            rows = chunk_rows(n, row_bytes)
            n_chunks = -(-n // rows)
            assert n_chunks * rows - n < n_chunks  # waste below one row per chunk
            assert rows * row_bytes <= 2 * (1 << 20) or rows == 1
    assert chunk_rows(0, 5376) == 1  # a shard left empty (more shards than rows)


def test_a_shard_with_no_rows_is_written_and_read(tmp_path):
    """Two shards of a one-row split: the first holds nothing, and both read back."""
    data = np.ones((1, 2, 3), dtype=np.float16)
    write_split(tmp_path, "selection", data, np.zeros(1, int), n_shards=2)
    write_manifest(sorted(tmp_path.glob("shard-*")), tmp_path / "manifest.json", ["selection"])
    x, y, idx = FeatureSet.open(tmp_path / "manifest.json", "selection").read_all()
    assert x.shape == (1, 2, 3) and list(idx) == [100]


def test_bytes_on_disk_near_minimum(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(900, 7, 384)).astype(np.float16)
    write_split(tmp_path, "train", data, np.zeros(900, int), n_shards=1)
    write_manifest([tmp_path / "shard-0-of-1"], tmp_path / "manifest.json", ["train"])
    on_disk = FeatureSet.open(tmp_path / "manifest.json", "train").bytes_on_disk()
    assert on_disk / data.nbytes < 1.01


def test_shard_rows_tile_exactly():
    for n in (0, 1, 7, 100):
        for k in (1, 3, 8):
            ranges = [shard_rows(n, k, i) for i in range(k)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_killed_extraction_leaves_nothing_a_rerun_accepts(tmp_path, tiny_bert):
    """SIGKILL an extraction midway: the shard directory must not exist, only a scratch one,
    which the next attempt clears before it writes the shard."""
    rng = np.random.default_rng(0)
    tokens_dir = tmp_path / "tokens"
    tokens_dir.mkdir()
    for split, n in (("train", 4000), ("selection", 8), ("dev", 8)):
        pd.DataFrame(
            {
                "idx": np.arange(n),
                "input_ids": [np.r_[101, rng.integers(1000, 5000, 60), 102].astype(np.int32) for _ in range(n)],
                "token_type_ids": [np.zeros(62, np.int8) for _ in range(n)],
                "length": np.full(n, 62, np.int32),
                "label": rng.integers(0, 2, n),
            }
        ).to_parquet(tokens_dir / f"{split}.parquet")
    out_dir = tmp_path / "features" / "shard-0-of-1"

    def extract(batch_size: int):
        settings = {"batch_size": batch_size, "block_rows": 64, "block_tokens": 65536}
        attrs = {k: v for k, v in ATTRS.items() if k != "encoder_parameters"}
        return [*BERTVISION, *extract_args(tiny_bert, tokens_dir, settings, attrs, out_dir=out_dir)]

    proc = subprocess.Popen(extract(1), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scratch = tmp_path / "features" / ".shard-0-of-1.tmp"
    deadline = time.time() + 120
    while time.time() < deadline and not (scratch / ".train.h5.tmp").exists():
        time.sleep(0.05)
    assert (scratch / ".train.h5.tmp").exists(), "extraction never started writing"
    assert proc.poll() is None, "extraction finished before it could be killed; give it more rows"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out_dir.exists() and scratch.exists()
    with pytest.raises(FeatureError):
        write_manifest([out_dir], tmp_path / "features" / "manifest.json", ["train"])
    assert not (tmp_path / "features" / "manifest.json").exists()

    subprocess.run(extract(256), cwd=REPO, check=True, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "features").iterdir()) == ["shard-0-of-1"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["dev.h5", "selection.h5", "train.h5"]


def test_a_shard_unreadable_mid_epoch_ends_the_stream_in_its_error(feature_dir):
    """The background reader's error reaches the trainer: an epoch over a shard whose chunk is
    corrupt (read unverified) raises, never ends early as if the split were shorter."""
    root, _, _ = feature_dir
    corrupt_first_chunk(root / "shard-1-of-3" / "train.h5")
    fs = FeatureSet.open(root / "manifest.json", "train", verify="none")
    with pytest.raises(FeatureError, match="shard-1-of-3/train.h5: unreadable HDF5 shard"):
        for _ in BatchStream(fs, batch_size=4, seed=1, buffer_rows=10, block_rows=6):
            pass


def test_the_stream_starts_from_a_shard_its_seed_draws(feature_dir):
    """Shards are visited in an order drawn from the seed: over ten seeds the first batch comes
    from more than one shard (read in order, it would always be the first shard's rows)."""
    root, data, _ = feature_dir
    fs = FeatureSet.open(root / "manifest.json", "train")
    shard_of = {bytes(row.astype(np.float32)): shard for shard in range(3)
                for row in data["train"][slice(*shard_rows(50, 3, shard))]}  # fmt: skip
    first = set()
    for seed in range(10):
        x, _ = next(iter(BatchStream(fs, batch_size=4, seed=seed, buffer_rows=10, block_rows=6)))
        first |= {shard_of[bytes(row)] for row in x.numpy()}
    assert len(first) > 1


def test_shards_that_overlap_or_run_past_the_split_are_refused(tmp_path):
    """The manifest records only shards that tile each split exactly: one overlapping the next,
    or shards covering more rows than the split has, are refused naming the shard or split."""
    data = np.zeros((10, 2, 4), np.float16)
    write_split(tmp_path / "a", "train", data, np.zeros(10, int), n_shards=2)  # rows 0-5 and 5-10
    wide = tmp_path / "a" / "shard-0-of-2"
    with ShardWriter(wide / "train.h5", 7, 2, {"cls": 4}, "int64",
                     {**ATTRS, "split": "train", "row_start": 0, "row_end": 7, "split_rows": 10}) as w:  # fmt: skip
        w.write_block(0, {"cls": data[:7]}, np.zeros(7, int), np.arange(7))
    with pytest.raises(FeatureError, match=r"shard-1-of-2/train.h5 starts at row 5, expected 7"):
        write_manifest(sorted((tmp_path / "a").glob("shard-*")), tmp_path / "a" / "manifest.json", ["train"])

    long = np.zeros((12, 2, 4), np.float16)
    write_split(tmp_path / "b", "train", long, np.zeros(12, int), n_shards=2)
    for shard in (tmp_path / "b").glob("shard-*/train.h5"):  # the split said to have 10 rows
        import h5py

        with h5py.File(shard, "r+") as f:
            f.attrs["split_rows"] = 10
    with pytest.raises(FeatureError, match="train shards cover 12 rows, the split has 10"):
        write_manifest(sorted((tmp_path / "b").glob("shard-*")), tmp_path / "b" / "manifest.json", ["train"])


def test_a_shard_out_of_range_or_written_in_part_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"shard 2 outside 0..1"):
        shard_rows(10, 2, 2)
    with pytest.raises(FeatureError, match="5 of 10 rows written"):
        with ShardWriter(tmp_path / "x.h5", 10, 2, {"cls": 3}, "int64", {**ATTRS, "split": "train"}) as w:
            w.write_block(0, {"cls": np.zeros((5, 2, 3))}, np.zeros(5), np.zeros(5))
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("change", ["truncated", "extended"])
def test_verify_size_alone_refuses_a_shard_whose_size_is_not_the_manifests(feature_dir, change):
    """``heads.verify: size`` reads no shard's bytes: it refuses one whose size is not the
    manifest's (cut short, or grown); a same-size change is sha256's to find; ``none`` only asks that
    the files exist."""
    root, _, _ = feature_dir
    path = root / "shard-1-of-3" / "train.h5"
    raw = path.read_bytes()
    path.write_bytes(raw[:-100] if change == "truncated" else raw + b"\0" * 100)
    now = len(raw) + (100 if change == "extended" else -100)
    said = rf"shard-1-of-3/train.h5: {now} bytes, the manifest says {len(raw)} \(truncated or replaced\)"
    with pytest.raises(FeatureError, match=said):
        FeatureSet.open(root / "manifest.json", "train", verify="size")
    assert FeatureSet.open(root / "manifest.json", "train", verify="none").n_examples == 50
    assert FeatureSet.open(root / "manifest.json", "dev", verify="size").n_examples == 7  # its own shards
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    assert FeatureSet.open(root / "manifest.json", "train", verify="size").n_examples == 50
    with pytest.raises(FeatureError, match="sha256 differs"):
        FeatureSet.open(root / "manifest.json", "train", verify="sha256")
