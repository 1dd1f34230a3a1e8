"""A pair task encoded apart (tasks.<task>.pair: apart): each distinct text tokenized and encoded
alone, once; per example and layer [u, v, |u-v|, u*v] of the two texts' states; the cosine head;
the config's checks. Serving it is tested in test_serve.py (answers equal the pipeline's, each
distinct text encoded once beside joint pairs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings, TokenizeSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.errors import ConfigError
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.layout import split_file, texts_file
from bertvision.registry.heads import PAIR_PARTS, READS
from bertvision.registry.task_spec import splits_of
from bertvision.registry.tasks import get_task
from tests.test_token_head import settings

SENTENCES = ["A man plays a guitar.", "A woman is slicing an onion.", "Stocks fell sharply today.", "The cat sat."]
MAX_LENGTH = 32


def raw_pairs(raw_dir, rows: int = 14, seed: int = 0) -> None:
    """STS-B-shaped splits whose pairs repeat sentences (as MRPC's and STS-B's do)."""
    rng = np.random.default_rng(seed)
    for split in splits_of(get_task("stsb")):
        picks = rng.integers(0, len(SENTENCES), size=(rows, 2))
        pd.DataFrame(
            {
                "idx": np.arange(rows),
                "sentence1": [SENTENCES[i] for i in picks[:, 0]],
                "sentence2": [f"{SENTENCES[j]} Once more {k % 3}." for k, j in enumerate(picks[:, 1])],
                "label": rng.uniform(0, 5, rows).astype(np.float32),
            }
        ).to_parquet(split_file(raw_dir, split))


@pytest.fixture
def tokens_apart(tmp_path, tiny_bert):
    from bertvision.stages.tokenize import tokenize_task

    raw, tokens = tmp_path / "raw", tmp_path / "tokens"
    raw.mkdir()
    raw_pairs(raw)
    settings = TokenizeSettings(backbone=str(tiny_bert), max_length=MAX_LENGTH, doc_stride=None, pair="apart")
    tokenize_task(get_task("stsb"), settings, raw, tokens)
    return raw, tokens


def alone(tokenizer, text: str) -> list[int]:
    return tokenizer(text, truncation=True, max_length=MAX_LENGTH)["input_ids"]


def test_each_distinct_text_is_tokenized_once_and_alone(tokens_apart, tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    raw, tokens = tokens_apart
    df = pd.read_parquet(split_file(raw, "dev"))
    texts = pd.read_parquet(texts_file(tokens, "dev"))
    split = TokenizedSplit.read(split_file(tokens, "dev"))
    assert len(texts) == len(set(df["sentence1"]) | set(df["sentence2"])) < 2 * len(df)
    assert len(split) == len(df) and split.sides.shape == (len(df), 2)  # the joint rows stay, for fine-tuning
    for (a, b), first, second in zip(split.sides, df["sentence1"], df["sentence2"]):
        assert texts["input_ids"][a].tolist() == alone(tokenizer, first)
        assert texts["input_ids"][b].tolist() == alone(tokenizer, second)


def test_the_states_of_a_pair_are_its_texts_encoded_alone(tokens_apart, tiny_bert, tmp_path):
    """Every row's features equal [u, v, |u-v|, u*v] of its two texts, each run through the encoder
    alone (a batch of one), per layer and for both [CLS] and the token mean; each shard encodes
    every distinct text its rows name once."""
    from transformers import AutoTokenizer

    from bertvision.features.encode import frozen_encoder, pair_features, per_example_states
    from bertvision.stages.extract import extract_shard

    raw, tokens = tokens_apart
    attrs = {
        "model": "tiny",
        "task": "stsb",
        "checkpoint": "0",
        "ft_seed": 1,
        "label_kind": "regression",
        "pair": "apart",
    }
    dirs = [tmp_path / "features" / f"shard-{i}-of-2" for i in range(2)]
    stats = [
        extract_shard(
            tiny_bert,
            tokens,
            d,
            i,
            2,
            ["dev"],
            ExtractSettings(batch_size=4, block_rows=5, block_tokens=256),
            ExtractCompute(device="cpu", precision="fp32", backend="torch"),
            attrs,
            threads=1,
        )
        for i, d in enumerate(dirs)
    ]
    manifest = write_manifest(dirs, tmp_path / "features" / "manifest.json", ["dev"])
    layers, hidden = manifest["layers"], manifest["hidden"]
    assert manifest["pair"] == "apart" and manifest["reads"] == list(READS)

    df = pd.read_parquet(split_file(raw, "dev"))
    split = TokenizedSplit.read(split_file(tokens, "dev"))
    halves = np.array_split(np.arange(len(df)), 2)
    assert [s["dev"]["texts"] for s in stats] == [len(np.unique(split.sides[rows])) for rows in halves]

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    model = frozen_encoder(tiny_bert, torch.device("cpu"))

    def states_alone(text: str) -> dict[str, torch.Tensor]:
        batch = tokenizer(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        with torch.inference_mode():
            hidden_states = model(**batch, output_hidden_states=True).hidden_states
        return {k: v.to(torch.float16) for k, v in per_example_states(hidden_states, batch["attention_mask"]).items()}

    for reads in READS:
        x, labels, idx = FeatureSet.open(tmp_path / "features" / "manifest.json", "dev").reading(reads).read_all()
        assert x.shape == (len(df), layers, hidden) and hidden == len(PAIR_PARTS) * model.config.hidden_size
        for row, (first, second) in enumerate(zip(df["sentence1"], df["sentence2"])):
            want = pair_features(states_alone(first)[reads], states_alone(second)[reads]).to(torch.float16)
            np.testing.assert_allclose(x[row].astype(np.float32), want[0].float().numpy(), rtol=1e-2, atol=1e-2)
        assert (idx == df["idx"].to_numpy()).all() and np.allclose(labels, df["label"])


def test_the_cosine_head_is_the_cosine_of_the_two_sides_layer_mix():
    from bertvision.features.encode import pair_features
    from bertvision.models.heads import build_head

    torch.manual_seed(0)
    u, v = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    head = build_head({"type": "cosine"}, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=1)
    with torch.no_grad():
        head.layer_logits.copy_(torch.tensor([0.0, 1.0, 2.0]))
        weights = torch.softmax(head.layer_logits, 0)
        mixed_u, mixed_v = (torch.einsum("l,nlh->nh", weights, s) for s in (u, v))
        cosine = torch.nn.functional.cosine_similarity(mixed_u, mixed_v, dim=-1)
        want = head.classifier.weight[0, 0] * cosine + head.classifier.bias[0]
        np.testing.assert_allclose(head(pair_features(u, v))[:, 0].numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_the_config_refuses_apart_where_a_pair_is_not_two_texts_or_not_stored():
    models = {"lp": {"type": "lp"}, "cos": {"type": "cosine"}}
    workflow = settings({"stsb": {"pair": "apart"}, "mrpc": None}, models=models)
    assert set(workflow.task_heads("stsb")) == {"lp", "cos"} and set(workflow.task_heads("mrpc")) == {"lp"}
    assert workflow.extract_attrs(workflow_run("stsb"))["pair"] == "apart"
    assert "pair" not in workflow.extract_attrs(workflow_run("mrpc"))  # joint extractions keep their params
    for tasks, why in (
        ({"sst2": {"pair": "apart"}}, "one text"),
        ({"stsb": {"pair": "apart", "token_features": True}}, "token_features"),
        ({"stsb": {"pair": "apart", "store": False}}, "store: false"),
        ({"mrpc": {"heads": ["cos"]}}, r"tasks\.mrpc\.heads: \['cos'\] read a pair's two texts apart"),
    ):
        with pytest.raises(ConfigError, match=why):
            settings(tasks, models=models)


def workflow_run(task: str):
    from bertvision.layout import Checkpoint, Run

    return Run("m", task, 1, Checkpoint(0))


def planted_similarity(root, layers: int = 3, side: int = 8):
    """Pair features of a similarity regression on STS-B's 0-5 scale whose label is the cosine of
    the last layer's two sides, stretched to 0.5-4.5 (the scale a served answer must keep)."""
    from bertvision.features.encode import pair_features
    from bertvision.features.shard_writer import ShardWriter

    rng = np.random.default_rng(0)
    sizes = {"train": 300, "selection": 100, "dev": 150}
    for split, n in sizes.items():
        u = torch.from_numpy(rng.normal(size=(n, layers, side))).float()
        mix = torch.from_numpy(rng.uniform(0, 1, size=(n, 1, 1))).float()
        v = mix * u + (1 - mix) * torch.from_numpy(rng.normal(size=(n, layers, side))).float()
        cosine = torch.nn.functional.cosine_similarity(u[:, -1], v[:, -1], dim=-1).numpy()
        labels = (0.5 + 4.0 * (cosine + 1) / 2).astype(np.float32)
        x = pair_features(u, v).numpy().astype(np.float16)
        attrs = {
            "model": "m",
            "task": "stsb",
            "checkpoint": "0",
            "ft_seed": 1,
            "split": split,
            "label_kind": "regression",
            "encoder_parameters": 10_000,
            "row_start": 0,
            "row_end": n,
            "split_rows": n,
        }
        with ShardWriter(root / "shard-0-of-1" / f"{split}.h5", n, layers, x.shape[-1], "float32", attrs) as w:
            w.write_block(0, x, labels, np.arange(n))
    write_manifest([root / "shard-0-of-1"], root / "manifest.json", list(sizes))
    return root / "manifest.json"


def test_a_regression_heads_answers_are_on_the_labels_scale(tmp_path):
    """STS-B's labels run 0-5; the cosine head starts at 0 and a head's learning rate moves its
    scale little, so without the labels' moments its answers stayed near 0.5 (Pearson, scale-free,
    did not see it; a served answer did). Its outputs, as evaluated and as loaded for serving, keep
    the labels' mean and spread."""
    import json

    import pandas as pd

    from bertvision.config.settings import HeadRuntimeSettings
    from bertvision.models.head_io import load_head
    from bertvision.stages.train_heads import train_heads
    from tests.stages import with_training
    from tests.test_train_head import SETTINGS as HEAD_SETTINGS

    manifest = planted_similarity(tmp_path / "features")
    heads = {"cos": {"type": "cosine"}, "lp": {"type": "lp"}}
    training = HEAD_SETTINGS.replace(learning_rate=1e-3, max_epochs=5)
    train_heads(
        get_task("stsb"),
        with_training(heads, training),
        HeadRuntimeSettings(device="cpu", verify="sha256"),
        manifest,
        [1],
        tmp_path / "heads",
        threads=1,
    )
    dev_x, dev_y, _ = FeatureSet.open(manifest, "dev").read_all()
    for name in heads:
        run = tmp_path / "heads" / name / "seed1"
        predictions = pd.read_parquet(run / "eval_predictions.parquet")
        predictions = predictions[predictions["split"] == "dev"]
        assert abs(predictions["prediction"].mean() - dev_y.mean()) < 0.25, (name, predictions["prediction"].mean())
        if name == "cos":  # the label is its cosine: it must reach the labels' spread too
            assert predictions["prediction"].std() > 0.7 * dev_y.std(), predictions["prediction"].std()
            record = json.loads((run / "metrics.json").read_text())
            assert record["metrics"]["dev"]["pearson"] > 0.9, record["metrics"]["dev"]
        head = load_head(run, dev_x.shape[1], dev_x.shape[2], 1)
        with torch.inference_mode():
            served = head(torch.from_numpy(dev_x.astype(np.float32)))[:, 0].numpy()
        np.testing.assert_allclose(served, predictions["prediction"].to_numpy(), rtol=1e-5, atol=1e-5)
