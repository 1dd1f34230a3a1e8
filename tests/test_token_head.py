"""The token-level GLUE head (type token-pool): padding invariance, token-level extraction of an
example task (whose [CLS] rows the [CLS] heads still read), training on a signal that only
token pooling can see, and the config rules around ``token_features``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.schema import validate_config
from bertvision.config.settings import ExtractCompute, ExtractSettings, HeadRuntimeSettings, HeadTrainingSettings
from bertvision.config.workflow import WorkflowSettings
from bertvision.errors import ConfigError, FeatureError
from bertvision.features.shard_writer import TokenShardWriter, shard_rows
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.models.heads import Standardized, TokenPoolHead, build_head, count_parameters
from bertvision.registry.heads import HEAD_TYPES, get_head_type, is_token_head
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
from tests.conftest import SHIPPED_SQUAD
from tests.stages import with_training

POOLS = get_head_type("token-pool").options["pool"].choices


# --- the head -------------------------------------------------------------------------------
def randomized_head(layers=4, hidden=16, outputs=3, pool="attention-mean") -> TokenPoolHead:
    torch.manual_seed(0)
    head = build_head({"type": "token-pool", "pool": pool}, layers, hidden, outputs)
    assert isinstance(head, TokenPoolHead)
    with torch.no_grad():  # away from the zero init, so attention and the mix are not uniform
        head.layer_logits.normal_()
        if pool != "mean":
            head.query.normal_(std=3.0)
    return head.eval()


@pytest.mark.parametrize("pool", POOLS)
def test_padding_never_changes_the_output(pool):
    head = randomized_head(pool=pool)
    example = torch.randn(7, 4, 16)  # 7 real tokens
    outs = []
    for width in (7, 8, 19, 64):
        x = torch.full((1, width, 4, 16), 1e4)  # padding holding large garbage
        x[0, 7:, 0, 0] = float("nan")
        x[0, :7] = example
        mask = torch.zeros(1, width, dtype=torch.bool)
        mask[0, :7] = True
        with torch.no_grad():
            outs.append(head(x, mask))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-6)
    # the same example in a batch beside a longer one, and behind a standardization
    other = torch.randn(1, 30, 4, 16)
    x = torch.zeros(2, 30, 4, 16)
    x[0, :7], x[1] = example, other[0]
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, :7], mask[1] = True, True
    with torch.no_grad():
        torch.testing.assert_close(head(x, mask)[:1], outs[0], rtol=1e-5, atol=1e-6)
        wrapped = Standardized(head, torch.randn(4, 16), torch.rand(4, 16) + 0.5)
        torch.testing.assert_close(wrapped(x, mask)[:1], wrapped(x[:1, :7], mask[:1, :7]), rtol=1e-5, atol=1e-6)


def test_attention_pools_by_each_tokens_score_against_the_query_scaled_by_root_hidden():
    head = randomized_head(pool="attention")
    x, mask = torch.randn(2, 6, 4, 16), torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with torch.no_grad():
        tokens = head.gamma * torch.einsum("l,btlh->bth", head.layer_weights(), x)
        scores = (tokens @ head.query / 4.0).masked_fill(~mask, float("-inf"))
        pooled = torch.einsum("bt,bth->bh", torch.softmax(scores, dim=-1), tokens)
        torch.testing.assert_close(head(x, mask), head.classifier(pooled))


def test_pooling_does_not_depend_on_positions():
    head = randomized_head()
    x = torch.randn(1, 9, 4, 16)
    perm = torch.randperm(9)
    with torch.no_grad():
        torch.testing.assert_close(head(x[:, perm]), head(x), rtol=1e-5, atol=1e-6)


def test_parameter_count_is_tiny_and_independent_of_length():
    # mix (L + gamma) + query (H) + classifier (2H x C + C)
    assert count_parameters(build_head({"type": "token-pool"}, 7, 384, 2)) == 7 + 1 + 384 + 2 * 384 * 2 + 2 == 1930
    assert count_parameters(build_head({"type": "token-pool", "pool": "mean"}, 13, 768, 3)) == 14 + 768 * 3 + 3
    assert is_token_head({"type": "token-pool"}) and not is_token_head({"type": "lp"})
    assert {name for name, t in HEAD_TYPES.items() if t.token_level} == {"token-pool", "ladder", "cnn2d"}


# --- extraction -----------------------------------------------------------------------------
def tokenized_split(path, n=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 40, n)
    ids = [np.r_[101, rng.integers(1000, 5000, k - 2), 102].astype(np.int32) for k in lengths]
    pd.DataFrame(
        {
            "idx": np.arange(n) + 1000,
            "input_ids": ids,
            "token_type_ids": [np.r_[np.zeros(k // 2), np.ones(k - k // 2)].astype(np.int8) for k in lengths],
            "length": lengths.astype(np.int32),
            "label": rng.integers(0, 2, n),
        }
    ).to_parquet(path)
    return lengths


def test_token_features_of_an_example_task_serve_the_cls_heads_too(tmp_path, tiny_bert):
    from bertvision.stages.extract import extract_shard

    tokens_dir = tmp_path / "tokens"
    tokens_dir.mkdir()
    lengths = tokenized_split(tokens_dir / "train.parquet")
    settings = ExtractSettings(batch_size=8, block_rows=16, block_tokens=200)
    compute = ExtractCompute(device="cpu", precision="fp32", backend="torch")
    attrs = {"model": "tiny", "task": "mrpc", "checkpoint": "0", "ft_seed": 1, "label_kind": "classification"}
    sets = {}
    for level, extra in (("cls", {}), ("tokens", {"features": "tokens"})):
        root = tmp_path / level
        dirs = [root / f"shard-{i}-of-2" for i in range(2)]
        for i, d in enumerate(dirs):
            extract_shard(tiny_bert, tokens_dir, d, i, 2, ["train"], settings, compute, {**attrs, **extra}, threads=1)
        write_manifest(dirs, root / "manifest.json", ["train"])
        sets[level] = FeatureSet.open(root / "manifest.json", "train")
    assert sets["cls"].feature == "cls" and sets["tokens"].feature == "tokens"
    cls_x, cls_y, cls_idx = sets["cls"].read_all()
    tok_x, tok_y, tok_idx = sets["tokens"].read_all()
    assert tok_x.shape == cls_x.shape == (40, 3, 32)
    np.testing.assert_allclose(tok_x.astype(np.float32), cls_x.astype(np.float32), rtol=2e-3, atol=2e-3)
    assert (tok_y == cls_y).all() and (tok_idx == cls_idx).all() and tok_y.dtype == np.int64

    examples = sets["tokens"].read_windows()
    assert (examples.lengths == lengths).all() and examples.char_offsets is None
    assert (examples.states[examples.window_offsets[:-1]] == tok_x).all()  # token 0 is the [CLS] row
    assert examples.labels.shape == (40,) and (examples.idx == cls_idx).all()
    with pytest.raises(FeatureError, match="token_features: true"):
        sets["cls"].read_windows()

    # the stored mean states: every layer averaged over each row's real tokens only (the rows of
    # a batch are padded to its longest, and the lengths differ), in both kinds of shard
    tokens = examples.states.astype(np.float32)
    direct = np.stack([tokens[examples.window(i)].mean(0) for i in range(len(examples))])
    for features in sets.values():
        assert features.manifest["reads"] == ["cls", "mean"]
        mean_x, mean_y, mean_idx = features.reading("mean").read_all()
        np.testing.assert_allclose(mean_x.astype(np.float32), direct, rtol=5e-3, atol=5e-3)
        assert (mean_y == cls_y).all() and (mean_idx == cls_idx).all()
    assert np.abs(mean_x.astype(np.float32) - cls_x.astype(np.float32)).max() > 0.1


# --- training -------------------------------------------------------------------------------
SETTINGS = HeadTrainingSettings(
    learning_rate=1e-2,
    batch_size=16,
    max_epochs=15,
    patience=5,
    weight_decay=0.0,
    warmup_ratio=0.0,
    in_memory_max_mb=4096,
    standardize=True,
)
RUNTIME = HeadRuntimeSettings(device="cpu", verify="size")


def planted_token_features(root, kind="classification", n_shards=2, encoder_dir=None):
    """Per example 4..16 tokens of noise; one token at a random position (never [CLS]) carries a
    marker (layer 2, dim 1) and the label (layer 2, dim 0). [CLS] holds no signal.
    ``encoder_dir``: the checkpoint the shards say they were extracted from."""
    rng = np.random.default_rng(0)
    layers, hidden = 4, 16
    sizes = {"train": 300, "selection": 100, "dev": 200}
    for split, n in sizes.items():
        lengths = rng.integers(4, 17, n)
        labels = rng.integers(0, 2, n) if kind == "classification" else rng.uniform(0, 5, n).astype(np.float32)
        signal = 2 * labels - 1 if kind == "classification" else labels - 2.5
        examples = []
        for k, s in zip(lengths, signal):
            x = rng.normal(size=(k, layers, hidden))
            x[:, 2, 1] -= 3.0
            t = rng.integers(1, k)
            x[t, 2, 1] = 6.0  # the marker
            x[t, 2, 0] = 2.0 * s + rng.normal() * 0.2
            examples.append(x)
        for shard in range(n_shards):
            a, b = shard_rows(n, n_shards, shard)
            attrs = {
                "model": "m",
                "task": "sst2" if kind == "classification" else "stsb",
                "checkpoint": "1",
                "ft_seed": 1,
                "split": split,
                "label_kind": kind,
                "features": "tokens",
                "encoder_parameters": 10_000,
                "row_start": a,
                "row_end": b,
                "split_rows": n,
                **({"encoder_dir": str(encoder_dir)} if encoder_dir else {}),
            }
            with TokenShardWriter(
                root / f"shard-{shard}-of-{n_shards}" / f"{split}.h5",
                lengths[a:b],
                layers,
                hidden,
                attrs,
                label_shape=(),
                label_dtype=labels.dtype,
                char_offsets=False,
                store_cls=True,
            ) as w:
                w.write_windows(0, np.concatenate(examples[a:b]), None, labels[a:b], np.arange(a, b))
    write_manifest(sorted(root.glob("shard-*")), root / "manifest.json", list(sizes))
    return root / "manifest.json"


def test_token_head_finds_a_signal_at_any_position(tmp_path, monkeypatch):
    from bertvision.training import tokens

    built = []
    init = tokens.TokenExampleProblem.__init__
    monkeypatch.setattr(
        tokens.TokenExampleProblem, "__init__", lambda self, *a, **k: (built.append(1), init(self, *a, **k))[1]
    )
    manifest = planted_token_features(tmp_path / "features")
    heads = {
        "tokens": {"type": "token-pool"},
        "tokens-attn": {"type": "token-pool", "pool": "attention"},
        "lp": {"type": "lp"},
    }
    train_heads(get_task("sst2"), with_training(heads, SETTINGS), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    assert len(built) == 1  # one token problem for both token heads
    record = {name: json.loads((tmp_path / "heads" / name / "seed1" / "metrics.json").read_text()) for name in heads}
    for name in ("tokens", "tokens-attn"):
        assert record[name]["metrics"]["dev"]["accuracy"] > 0.9, record[name]["metrics"]
        assert int(np.argmax(record[name]["layer_weights"])) == 2
        assert record[name]["parameters"] < 100
    # the [CLS] head reads the [CLS] rows of the same token shards, which carry no signal
    assert record["lp"]["metrics"]["dev"]["accuracy"] < 0.7
    predictions = pd.read_parquet(tmp_path / "heads" / "tokens" / "seed1" / "eval_predictions.parquet")
    labels = FeatureSet.open(manifest, "dev").read_all()[1]
    assert len(predictions) == 200 and (predictions["label"].to_numpy() == labels).all()
    assert (predictions["idx"].to_numpy() == np.arange(200)).all()


def test_token_head_regression_with_ensembles_and_a_streamed_cls_head(tmp_path):
    manifest = planted_token_features(tmp_path / "features", kind="regression")
    bert = tmp_path / "eval_logits.npz"
    n_dev = FeatureSet.open(manifest, "dev").n_examples
    np.savez(
        bert,
        **{
            "dev/values": np.random.default_rng(1).normal(size=(n_dev, 1)).astype(np.float32),
            "dev/lengths": np.ones(n_dev, np.int64),
        },
    )
    # The [CLS] head streams its rows; a larger step: the output bias has to reach the labels' mean (2.5).
    settings = SETTINGS.replace(learning_rate=5e-2, in_memory_max_mb=0)
    heads = {"tokens": {"type": "token-pool"}, "lp": {"type": "lp"}}
    train_heads(
        get_task("stsb"),
        with_training(heads, settings),
        RUNTIME,
        manifest,
        [1],
        tmp_path / "heads",
        threads=1,
        bert_logits=bert,
    )
    tokens = json.loads((tmp_path / "heads" / "tokens" / "seed1" / "metrics.json").read_text())
    assert tokens["metrics"]["dev"]["pearson"] > 0.8, tokens["metrics"]
    assert set(tokens["ensembles"]) == {"mean"} and "pearson" in tokens["ensembles"]["mean"]["dev"]
    lp = json.loads((tmp_path / "heads" / "lp" / "seed1" / "metrics.json").read_text())
    assert lp["data_in_memory"] is False and lp["train_examples"] == 300


def test_cls_features_give_a_clear_error_to_a_token_head(tmp_path):
    from tests.test_train_head import planted_features

    manifest = planted_features(tmp_path / "features", n_shards=1)
    with pytest.raises(FeatureError, match=r"tasks\.sst2\.token_features: true"):
        train_heads(
            get_task("sst2"),
            with_training({"t": {"type": "token-pool"}}, SETTINGS),
            RUNTIME,
            manifest,
            [1],
            tmp_path / "h",
            threads=1,
        )


# --- configuration ----------------------------------------------------------------------------
def settings(tasks: dict, models=None) -> WorkflowSettings:
    models = models or {"lp": {"type": "lp"}, "tok": {"type": "token-pool", "pool": "attention"}}
    return WorkflowSettings(
        validate_config({"backbones": {"b": {"pretrained": "x"}}, "tasks": tasks, "heads": {"models": models}})
    )


def test_token_heads_only_for_tasks_with_token_features():
    s = settings({"mrpc": {"token_features": True}, "stsb": None, "sst2": {}, "squad2": SHIPPED_SQUAD})
    assert list(s.task_heads("mrpc")) == ["lp", "tok"]
    assert list(s.task_heads("stsb")) == list(s.task_heads("sst2")) == list(s.task_heads("squad2")) == ["lp"]
    assert [s.feature_level(t) for t in ("mrpc", "stsb", "sst2", "squad2")] == ["tokens", "cls", "cls", "tokens"]


def test_listing_a_token_head_without_token_features_is_an_error():
    with pytest.raises(ConfigError, match=r"tasks\.mrpc\.token_features: true"):
        settings({"mrpc": {"heads": ["lp", "tok"]}})
    with pytest.raises(ConfigError, match=r"tasks\.squad2\.token_features"):
        settings({"squad2": {"token_features": True}})
    with pytest.raises(
        ConfigError, match=r"tasks.rte: no head in heads.models trains on it: \['tok'\] are token-level"
    ):
        settings({"rte": None}, models={"tok": {"type": "token-pool"}})
    # a head that reads a pair apart is not token-level: the reason names what it lacks
    with pytest.raises(ConfigError, match=r"tasks.cola: .*\['tok'\] are token-level .*; \['cos'\] read a pair's two"):
        settings({"cola": None}, models={"tok": {"type": "token-pool"}, "cos": {"type": "cosine"}})
    with pytest.raises(ConfigError, match="pool"):
        settings({"rte": None}, models={"tok": {"type": "token-pool", "pool": "max"}})
