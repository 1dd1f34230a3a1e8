"""A pair read apart (heads.models.<head>.pair: apart): each distinct text tokenized and encoded
alone, once; per example and layer [u, v, |u-v|, u*v] of the two texts' states; the cosine head;
the config's checks. Serving it is tested in test_serve.py (answers equal the pipeline's, each
distinct text encoded once beside joint pairs)."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import ExtractCompute, ExtractSettings, TokenizeSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.errors import ConfigError
from bertvision.features.store import FeatureSet, write_manifest
from bertvision.layout import split_file, texts_file
from bertvision.registry.states import PAIR_PARTS, READS, states_name
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
    settings = TokenizeSettings(backbone=str(tiny_bert), max_length=MAX_LENGTH, doc_stride=None)
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


@pytest.mark.parametrize("pair_forms", [["apart"], ["joint", "apart"]])
def test_the_states_of_a_pair_are_its_texts_encoded_alone(tokens_apart, tiny_bert, tmp_path, pair_forms):
    """Every row's features equal [u, v, |u-v|, u*v] of its two texts, each run through the encoder
    alone (a batch of one), per layer and for both [CLS] and the token mean; each shard encodes
    every distinct text its rows name once; beside the joint states too (the second shard's rows
    found by their place in the split, not in the shard)."""
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
        "pair_forms": pair_forms,
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
    apart_reads = [states_name(r, "apart") for r in READS]
    assert manifest["pair_forms"] == pair_forms and manifest["reads"][-len(apart_reads) :] == apart_reads
    assert manifest["source"]["pair_forms"] == pair_forms  # a stream source's key, as the shards were made

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

    assert hidden == model.config.hidden_size
    for reads in READS:
        view = FeatureSet.open(tmp_path / "features" / "manifest.json", "dev").reading(states_name(reads, "apart"))
        x, labels, idx = view.read_all()
        assert x.shape == (len(df), layers, len(PAIR_PARTS) * hidden) and view.shape == x.shape[1:]
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


def test_a_standardized_cosine_head_scores_a_pair_the_same_either_way_round():
    """The train split's u and v columns have moments of their own (the first texts of a pair are
    not the second's); standardized apart, a swap of the texts moved served STS-B scores by up to 0.1."""
    from bertvision.features.encode import pair_features
    from bertvision.models.heads import build_head, standardized

    torch.manual_seed(0)
    u, v = torch.randn(64, 3, 8) * 2 + 1, torch.randn(64, 3, 8) * 0.5 - 1
    train = pair_features(u, v)
    moments = (train.mean(0), train.std(0, correction=0))
    for spec in ({"type": "cosine"}, {"type": "cosine", "residual": 4}):
        head = standardized(build_head(spec, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=1), moments)
        with torch.no_grad():
            for parameter in head.parameters():
                parameter.normal_()
            x, y = torch.randn(16, 3, 8), torch.randn(16, 3, 8)
            torch.testing.assert_close(head(pair_features(x, y)), head(pair_features(y, x)))
        pooled = torch.cat([u, v]).mean(0)  # u's and v's standardized by their pooled moments
        torch.testing.assert_close(head.mean[:, :8], pooled, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.mean[:, 8:16], pooled, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head.mean[:, 16:], moments[0][:, 16:])
        pooled_std = torch.cat([u, v]).std(0, correction=0)  # the means' spread included
        torch.testing.assert_close(1 / head.inv_std[:, 8:16], pooled_std, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(1 / head.inv_std[:, 16:], moments[1][:, 16:])


def test_a_cosine_head_fitted_to_a_batch_answers_its_labels_on_their_own_scale():
    """``fit_output`` reads a batch as the head will (the input standardized, the labels in standard
    units) and the wrapper turns answers back to the labels' scale: labels that are a line of the
    head's own cosine, with a mean of 10 and a spread of 3, are answered exactly from the start."""
    from bertvision.features.encode import pair_features
    from bertvision.models.heads import build_head, fit_output, standardized

    torch.manual_seed(0)
    x = pair_features(torch.randn(64, 3, 8) * 2 + 1, torch.randn(64, 3, 8) * 0.5 - 1)
    head = build_head({"type": "cosine"}, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=1)
    head = standardized(head, (x.mean(0), x.std(0)), (torch.tensor(10.0), torch.tensor(3.0)))
    with torch.no_grad():
        head.head.layer_logits.normal_()
        cosine = head.head.cosine(head.standardize_input(x))[:, 0]
        labels = 10 + 3 * (cosine - cosine.mean()) / cosine.std(correction=0)
        fit_output(head, x, labels, 1)
        torch.testing.assert_close(head(x)[:, 0], labels, atol=1e-4, rtol=1e-4)


def test_a_cosine_classifier_fitted_to_a_batch_starts_each_class_on_its_own_line():
    """For a classification ``fit_output`` fits one line per class to the one-hot labels: labels
    that follow the cosine give the positive class a rising score and the negative a falling one,
    and the fitted head already separates the batch."""
    from bertvision.features.encode import pair_features
    from bertvision.models.heads import build_head, fit_output

    torch.manual_seed(0)
    u = torch.randn(64, 3, 8)
    v = torch.where(torch.arange(64)[:, None, None] % 2 == 1, u + 0.3 * torch.randn(64, 3, 8), torch.randn(64, 3, 8))
    x, labels = pair_features(u, v), torch.arange(64) % 2
    head = build_head({"type": "cosine"}, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=2)
    with torch.no_grad():
        fit_output(head, x, labels, 2)
        weight = head.classifier.weight[:, 0]
        assert weight[1] > 0 > weight[0] and torch.allclose(weight[0], -weight[1])
        assert (head(x).argmax(-1) == labels).float().mean() > 0.9


def test_a_cosine_head_saved_with_each_sides_own_moments_loads_as_saved_and_says_so(tmp_path, caplog):
    """A head trained before the two sides were standardized alike keeps the buffers it was scored
    with (its served answers equal its evaluation), and its load says it is not symmetric."""
    from safetensors.torch import load_file, save_file

    from bertvision.layout import HEAD_METRICS, HEAD_WEIGHTS
    from bertvision.models.head_io import load_head, save_head
    from bertvision.models.heads import build_head, standardized

    spec, hidden = {"type": "cosine"}, len(PAIR_PARTS) * 8
    moments = (torch.randn(3, hidden), torch.rand(3, hidden) + 0.5)
    for name, alike in (("alike", True), ("old", False)):
        run = tmp_path / name
        save_head(standardized(build_head(spec, 3, hidden, 1), moments), "cosine", spec, run)
        (run / HEAD_METRICS).write_text(json.dumps({"head_spec": spec}))
        state = load_file(str(run / HEAD_WEIGHTS))
        if not alike:  # as it was saved before: u's and v's own moments
            state["mean"] = moments[0]
            save_file(state, str(run / HEAD_WEIGHTS))
        caplog.clear()
        loaded = load_head(run, 3, hidden, 1)
        torch.testing.assert_close(loaded.mean, state["mean"])
        said = [r.getMessage() for r in caplog.records if "standardized alike" in r.getMessage()]
        assert said == ([] if alike else [f"{run}: a cosine head saved before its pair's two sides were standardized "
                                          "alike: it scores (a, b) and (b, a) differently; train it again (its "
                                          "train_heads job) for one score either way round"])  # fmt: skip


def test_the_cosine_heads_correction_starts_at_zero_and_learns_what_the_cosine_cannot():
    from bertvision.features.encode import pair_features
    from bertvision.models.heads import build_head

    torch.manual_seed(0)
    u, v = torch.randn(64, 3, 8), torch.randn(64, 3, 8)
    x, target = pair_features(u, v), u[:, -1, :1]  # one coordinate of one side: no cosine gives it
    plain = build_head({"type": "cosine"}, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=1)
    corrected = build_head({"type": "cosine", "residual": 16}, layers=3, hidden=len(PAIR_PARTS) * 8, outputs=1)
    with torch.no_grad():
        for head in (plain, corrected):
            head.fit_output(x, target)
        torch.testing.assert_close(corrected(x), plain(x))  # the same start: the fitted cosine

    def trained_loss(head) -> float:
        optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
        for _ in range(200):
            loss = torch.nn.functional.mse_loss(head(x), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.item()

    assert trained_loss(corrected) < 0.2 * trained_loss(plain)


def test_a_task_extracts_each_pair_form_its_heads_read_and_the_config_refuses_apart_where_it_cannot_be():
    models = {"lp": {"type": "lp"}, "lp-apart": {"type": "lp", "pair": "apart"}, "cos": {"type": "cosine"}}
    workflow = settings({"stsb": None, "mrpc": {"heads": ["lp"]}, "sst2": None}, models=models)
    assert set(workflow.task_heads("stsb")) == {"lp", "lp-apart", "cos"} and set(workflow.task_heads("sst2")) == {"lp"}
    assert workflow.pair_forms("stsb") == ("joint", "apart") and workflow.pair_forms("mrpc") == ("joint",)
    assert workflow.extract_attrs(workflow_run("stsb"))["pair_forms"] == ["joint", "apart"]
    assert "pair_forms" not in workflow.extract_attrs(workflow_run("mrpc"))  # joint extractions keep their params
    only_apart = settings({"stsb": {"heads": ["cos"]}}, models=models)
    assert only_apart.pair_forms("stsb") == ("apart",)
    for tasks, why in (
        ({"sst2": {"heads": ["lp-apart"]}}, r"tasks\.sst2\.heads: \['lp-apart'\] read a pair's two texts encoded"),
        ({"stsb": {"heads": ["lp-apart"], "store": False}}, "store: false"),
        ({"stsb": {"pair": "apart"}}, r"tasks\.stsb: 'pair' is no longer a key here: .*heads\.models\.<head>\.pair"),
    ):
        with pytest.raises(ConfigError, match=why):
            settings(tasks, models=models)
    # beside every token's states too (the token-level heads')
    with_tokens = settings({"stsb": {"token_features": True}}, models=models)
    assert with_tokens.pair_forms("stsb") == ("joint", "apart") and "cos" in with_tokens.task_heads("stsb")
    # unlisted, the apart heads skip a task where they cannot read apart
    assert set(settings({"stsb": {"store": False}}, models=models).task_heads("stsb")) == {"lp"}


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
        path = root / "shard-0-of-1" / f"{split}.h5"
        with ShardWriter(path, n, layers, {"apart-cls": x.shape[-1]}, "float32", attrs) as w:
            w.write_block(0, {"apart-cls": x}, labels, np.arange(n))
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
    heads = {"cos": {"type": "cosine"}, "lp": {"type": "lp", "pair": "apart"}}
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
    dev_x, dev_y, _ = FeatureSet.open(manifest, "dev").reading("apart-cls").read_all()
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


def raw_equal_pairs(raw_dir, seed: int = 0) -> None:
    """MRPC-shaped splits whose label is whether a pair's two texts are the same text: a signal
    the pair encoded apart carries exactly (|u - v| = 0) and the joint sequence of a random
    encoder hardly does. Texts are random words, so no pair is seen twice."""
    rng = np.random.default_rng(seed)
    words = "cat dog runs sat the a man woman guitar plays onion stocks fell sharply today bank river old new".split()
    sizes = {"train": 160, "selection": 60, "dev": 60}
    for split in splits_of(get_task("mrpc")):
        n = sizes[split]
        first = [" ".join(rng.choice(words, size=rng.integers(4, 9))) for _ in range(n)]
        same = rng.integers(0, 2, size=n)
        second = [a if s else " ".join(rng.choice(words, size=rng.integers(4, 9))) for a, s in zip(first, same)]
        pd.DataFrame({"idx": np.arange(n), "sentence1": first, "sentence2": second, "label": same}).to_parquet(
            split_file(raw_dir, split)
        )


def test_selection_picks_the_pair_form_that_carries_the_signal(tiny_bert, tmp_path):
    """Both forms extracted in one shard (a head of each reads it), a head of each trained, and the
    one ranking (the race's and the pick's) chooses on selection the head that reads the pair apart,
    where only the apart form carries the label; dev agrees."""
    from bertvision.config.settings import HeadRuntimeSettings
    from bertvision.reporting.ranking import best, head_candidates
    from bertvision.stages.extract import extract_shard
    from bertvision.stages.tokenize import tokenize_task
    from bertvision.stages.train_heads import train_heads
    from tests.stages import with_training
    from tests.test_train_head import SETTINGS as HEAD_SETTINGS

    task = get_task("mrpc")
    raw, tokens, shard = tmp_path / "raw", tmp_path / "tokens", tmp_path / "features" / "shard-0-of-1"
    raw.mkdir()
    raw_equal_pairs(raw)
    tokenize_task(task, TokenizeSettings(backbone=str(tiny_bert), max_length=MAX_LENGTH, doc_stride=None), raw, tokens)
    attrs = {"model": "tiny", "task": "mrpc", "checkpoint": "0", "ft_seed": 1, "label_kind": "classification",
             "pair_forms": ["joint", "apart"]}  # fmt: skip
    extract = ExtractSettings(batch_size=16, block_rows=64, block_tokens=1024)
    compute = ExtractCompute(device="cpu", precision="fp32", backend="torch")
    extract_shard(tiny_bert, tokens, shard, 0, 1, list(splits_of(task)), extract, compute, attrs, threads=1)
    manifest = write_manifest([shard], tmp_path / "features" / "manifest.json", list(splits_of(task)))
    assert manifest["reads"] == ["cls", "mean", "apart-cls", "apart-mean"]

    heads = {"joint": {"type": "lp", "reads": "mean"}, "apart": {"type": "lp", "reads": "mean", "pair": "apart"}}
    training = HEAD_SETTINGS.replace(learning_rate=1e-2, max_epochs=20)
    runtime = HeadRuntimeSettings(device="cpu", verify="sha256")
    started = time.perf_counter()
    train_heads(task, with_training(heads, training), runtime, tmp_path / "features" / "manifest.json", [1, 2],
                tmp_path / "heads", threads=1)  # fmt: skip
    wall = time.perf_counter() - started
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "heads").glob("*/seed*/metrics.json"))]
    assert {(r["head"], r["pair"]) for r in records} == {("joint", "joint"), ("apart", "apart")}
    # the job's seconds shared out once: its runs' seconds add up to no more than the job took
    assert sum(r["seconds"] for r in records) <= wall and all(r["runs_together"] == 4 for r in records)
    for r in records:
        assert r["parameter_percent"] == pytest.approx(100 * r["parameters"] / r["encoder_parameters"])
    dev = {r["head"]: r["metrics"]["dev"]["accuracy"] for r in records if r["seed"] == 1}
    assert best(head_candidates(task, records)).name == "apart", [(r["head"], r["metrics"]) for r in records]
    assert dev["apart"] > 0.9 and dev["apart"] > dev["joint"] + 0.1, dev


def test_a_token_shard_keeps_the_pairs_encoded_apart_beside_every_token(tokens_apart, tiny_bert, tmp_path):
    """A pair task with token_features whose heads read both forms: its token shards hold every
    token of the joint pair and, per example, the apart states, equal to a [CLS]-level shard's."""
    from bertvision.stages.extract import extract_shard

    _, tokens = tokens_apart
    attrs = {"model": "tiny", "task": "stsb", "checkpoint": "0", "ft_seed": 1, "label_kind": "regression",
             "pair_forms": ["joint", "apart"]}  # fmt: skip
    extract = ExtractSettings(batch_size=4, block_rows=5, block_tokens=256)
    compute = ExtractCompute(device="cpu", precision="fp32", backend="torch")
    views = {}
    for level in ("cls", "tokens"):
        root = tmp_path / level
        level_attrs = {**attrs, **({"features": "tokens"} if level == "tokens" else {})}
        extract_shard(tiny_bert, tokens, root / "shard-0-of-1", 0, 1, ["dev"], extract, compute, level_attrs, threads=1)
        manifest = write_manifest([root / "shard-0-of-1"], root / "manifest.json", ["dev"])
        assert manifest["feature"] == level and manifest["reads"] == ["cls", "mean", "apart-cls", "apart-mean"]
        views[level] = FeatureSet.open(root / "manifest.json", "dev")
    assert views["tokens"].read_windows().lengths.sum() > 0
    for name in ("apart-cls", "apart-mean", "mean"):
        got, want = (views[level].reading(name).read_all()[0] for level in ("tokens", "cls"))
        np.testing.assert_array_equal(got, want)


def test_the_tokenize_record_counts_the_pairs_cut_at_max_length(tmp_path, tiny_bert):
    """``at_max_length``: the rows at max_length (cut to it, or exactly that long), as the
    tokenizer itself finds them uncut; max_length the pairs' median length."""
    from transformers import AutoTokenizer

    from bertvision.stages.tokenize import tokenize_task

    raw = tmp_path / "raw"
    raw.mkdir()
    raw_pairs(raw)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    uncut = {}
    for split in splits_of(get_task("stsb")):
        df = pd.read_parquet(split_file(raw, split))
        uncut[split] = [len(ids) for ids in tokenizer(list(df["sentence1"]), list(df["sentence2"]))["input_ids"]]
    max_length = int(np.median([n for lengths in uncut.values() for n in lengths]))
    settings = TokenizeSettings(backbone=str(tiny_bert), max_length=max_length, doc_stride=None)
    stats = tokenize_task(get_task("stsb"), settings, raw, tmp_path / "tokens")
    assert {split: record["at_max_length"] for split, record in stats.items()} == {
        split: sum(n >= max_length for n in lengths) for split, lengths in uncut.items()
    }
    assert 0 < sum(record["at_max_length"] for record in stats.values()) < sum(map(len, uncut.values()))


def test_an_extraction_refuses_what_its_settings_cannot_make(tokens_apart, tiny_bert, tmp_path):
    """BERT's outputs come from the joint pair, which an apart-only extraction does not run; a
    span task's features are its tokens, never [CLS] rows alone."""
    from bertvision.features.extractors import feature_level
    from bertvision.stages.extract import extract_shard

    _, tokens = tokens_apart
    attrs = {"model": "tiny", "task": "stsb", "checkpoint": "0", "ft_seed": 1, "label_kind": "regression",
             "pair_forms": ["apart"]}  # fmt: skip
    with pytest.raises(ValueError, match="a pair encoded apart is not BERT's input"):
        extract_shard(tiny_bert, tokens, tmp_path / "shard-0-of-1", 0, 1, ["dev"],
                      ExtractSettings(batch_size=4, block_rows=5, block_tokens=256),
                      ExtractCompute(device="cpu", precision="fp32", backend="torch"), attrs, keep_bert_logits=True,
                      threads=1)  # fmt: skip
    assert feature_level({"label_kind": "span"}) == "tokens"
    with pytest.raises(ValueError, match="features 'cls' for a span task"):
        feature_level({"label_kind": "span", "features": "cls"})
