"""The peers (config ``peers``): what a practitioner would use instead of the BERTVision path.
The pooling a backbone declares (a sentence-transformers layout stand-in, and the mean
fallback); the embedding and cosine peers run on a tiny BERT and checked against a computation
done another way (one text at a time, scipy's Pearson); the parameters LoRA and BitFit leave
trainable; the choices made on selection only; the peers' rows, whole cost and verdict in the
summary worked by hand."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.settings import PeerSettings
from bertvision.jobs import Job, peer_job
from bertvision.layout import PEER_FILE, PEER_METRICS, PEER_PREDICTIONS
from bertvision.peers import embedding as emb
from bertvision.peers.pooling import MEAN_FALLBACK, Pooling, declared_pooling, pool
from bertvision.registry.peers import applicable, inapplicable
from bertvision.registry.tasks import get_task
from bertvision.stages.peer import sentence_embedding
from tests.conftest import workflow_settings
from tests.tiny_bert import DEFAULT_BACKBONE


def st_layout(folder: Path, pooling: dict, normalize: bool) -> Path:
    """A sentence-transformers folder's layout files (the weights are not read here)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **pooling}))
    return folder


def test_the_pooling_is_read_from_a_sentence_transformers_layout(tmp_path):
    cls = st_layout(tmp_path / "cls", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, True)
    assert declared_pooling(str(cls)) == Pooling(("cls",), True, "1_Pooling/config.json")
    both = st_layout(tmp_path / "both", {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, False)
    assert declared_pooling(str(both)).modes == ("max", "mean") and not declared_pooling(str(both)).normalize
    # the shipped backbone declares mean pooling and unit length
    from bertvision.models.backbone import resolve_pretrained

    shipped = declared_pooling(resolve_pretrained(DEFAULT_BACKBONE))
    assert (shipped.modes, shipped.normalize) == (("mean",), True)


def test_a_backbone_that_declares_no_pooling_is_mean_pooled(tiny_bert):
    assert declared_pooling(str(tiny_bert)) == Pooling(("mean",), False, MEAN_FALLBACK)


def test_pooling_reads_real_tokens_only():
    states = torch.tensor(
        [[[1.0, 2.0], [3.0, 4.0], [1e6, -1e6]], [[5.0, 0.0], [1e6, 1e6], [1e6, 1e6]]]
    )  # padding planted far off
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert pool(states, mask, Pooling(("mean",), False, "")).tolist() == [[2.0, 3.0], [5.0, 0.0]]
    assert pool(states, mask, Pooling(("max",), False, "")).tolist() == [[3.0, 4.0], [5.0, 0.0]]
    assert pool(states, mask, Pooling(("cls", "mean"), False, "")).tolist() == [[1.0, 2.0, 2.0, 3.0], [5, 0, 5, 0]]
    unit = pool(states, mask, Pooling(("mean",), True, ""))
    assert torch.allclose(unit.norm(dim=1), torch.ones(2))


@pytest.mark.parametrize(
    "config",
    [
        {"pooling_mode": "weightedmean"},
        {"pooling_mode": "lasttoken"},
        {"pooling_mode": ["mean_sqrt_len_tokens", "cls", "max"]},  # sentence-transformers 6: in this order
        {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},  # older: max first, as it concatenates
        {"pooling_mode_weightedmean_tokens": True, "pooling_mode_lasttoken": True},
        {"pooling_mode_cls_token": False},  # no mode set: mean
    ],
)
def test_every_declared_pooling_embeds_as_sentence_transformers_does(tmp_path, config):
    """Each pooling a backbone's layout may declare, read from its config.json and run on padded
    states, against sentence-transformers' own Pooling module loaded from the same folder."""
    from sentence_transformers.sentence_transformer.modules import Pooling as StPooling

    folder = st_layout(tmp_path / "st", config, normalize=False)
    torch.manual_seed(0)
    states, mask = torch.randn(3, 5, 8), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    theirs = StPooling.load(str(folder / "1_Pooling"))
    want = theirs({"token_embeddings": states, "attention_mask": mask})["sentence_embedding"]
    torch.testing.assert_close(pool(states, mask, declared_pooling(str(folder))), want)


def test_a_label_without_training_rows_keeps_the_columns_of_the_others():
    """scikit-learn's classifier has a column per class its training rows held: with MNLI's label 1
    absent, its column 1 is label 2's, and reading columns as label ids predicted the absent label."""
    task = get_task("mnli")
    rng = np.random.default_rng(0)
    labels = rng.choice([0, 2], size=200)
    features = rng.normal(size=(200, 4)) + labels[:, None]
    model = emb.linear_model(task, 1.0).fit(features, labels)
    outputs = emb.outputs_of(task, model, features)
    assert outputs.shape == (200, 3) and np.isfinite(outputs).all()
    assert (outputs.argmax(1) == model.predict(features)).all() and set(outputs.argmax(1)) == {0, 2}
    np.testing.assert_allclose(np.exp(outputs[:, [0, 2]]), model.predict_proba(features), atol=1e-9)


def test_the_cosine_of_planted_embeddings():
    u = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    v = np.array([[0.0, 2.0], [6.0, 8.0], [-2.0, -2.0]])
    assert emb.cosine([u, v]).ravel().tolist() == pytest.approx([0.0, 1.0, -1.0])
    sets = emb.feature_sets([u, v])
    assert sets["[|u-v|, u*v, cos]"][1].tolist() == pytest.approx([3.0, 4.0, 18.0, 32.0, 1.0])
    assert sets["[u, v, |u-v|, u*v]"].shape == (3, 8)
    assert sets["[u, v, |u-v|, u*v]"][1].tolist() == pytest.approx([3.0, 4.0, 6.0, 8.0, 3.0, 4.0, 18.0, 32.0])
    swapped = emb.feature_sets([v, u])
    np.testing.assert_array_equal(swapped["[|u-v|, u*v, cos]"], sets["[|u-v|, u*v, cos]"])


def stsb_rows(n: int = 12, offset: int = 0) -> pd.DataFrame:
    """STS-B pairs from the shipped GLUE files."""
    from bertvision.data.glue_files import locate, parse_split
    from tests.conftest import SHIPPED_GLUE

    task = get_task("stsb")
    rows = parse_split(locate(SHIPPED_GLUE, task, "train"), task, "train").iloc[offset : offset + n]
    return rows.reset_index(drop=True)[["idx", "sentence1", "sentence2", "label"]]


def settings_of(tiny_bert: Path, method: dict) -> PeerSettings:
    return PeerSettings.from_dict({"backbone": str(tiny_bert), "optimizer": None, "method": method})


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_the_cosine_peer_is_the_cosine_of_each_text_encoded_alone(tiny_bert, backend, tmp_path, monkeypatch):
    """The stage encodes distinct texts once, sorted by length in padded batches (by PyTorch or
    ONNX Runtime); here each text goes through PyTorch alone, unpadded, its tokens averaged by
    hand, and scipy scores it."""
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))
    from scipy.stats import pearsonr
    from transformers import AutoModel, AutoTokenizer

    task = get_task("stsb")
    rows = {"train": stsb_rows(6), "selection": stsb_rows(6, 6), "dev": stsb_rows(10, 12)}
    settings = settings_of(tiny_bert, {"method": "cosine", "batch_size": 4, "max_length": 64, "backend": backend})
    result = sentence_embedding(task, settings, rows)
    assert result["trainable_parameters"] == 0 and result["pooling"]["declared_by"] == MEAN_FALLBACK
    assert result["precision"] == {"torch": "fp32", "onnx": "fp32 (ONNX Runtime)"}[backend]

    model, tokenizer = AutoModel.from_pretrained(tiny_bert).eval(), AutoTokenizer.from_pretrained(tiny_bert)

    def embed(text: str) -> np.ndarray:
        with torch.inference_mode():
            ids = tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
            return model(**ids).last_hidden_state[0].mean(0).numpy()

    dev = rows["dev"]
    cosines = []
    for a, b in zip(dev["sentence1"], dev["sentence2"]):
        u, v = embed(a), embed(b)
        cosines.append(float(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))
    assert result["metrics"]["dev"]["pearson"] == pytest.approx(pearsonr(cosines, dev["label"])[0], abs=1e-4)


def test_the_embedding_peer_chooses_on_selection_only(tiny_bert):
    """The linear model's features and strength are the best on selection among those tried;
    new dev labels change the dev score, never the choice."""
    task = get_task("stsb")
    rows = {"train": stsb_rows(40), "selection": stsb_rows(20, 40), "dev": stsb_rows(20, 60)}
    method = {"method": "embedding", "regularization": [0.1, 1.0, 10.0], "batch_size": 8, "max_length": 64}
    settings = settings_of(tiny_bert, {**method, "backend": "torch"})
    first = sentence_embedding(task, settings, rows)
    assert len(first["tried"]) == 2 * 3  # two feature sets of a pair, three strengths
    best = max(first["tried"], key=lambda t: t["selection"])
    assert first["chosen"] == {"features": best["features"], "regularization": best["regularization"]}
    flipped = {**rows, "dev": rows["dev"].assign(label=5.0 - rows["dev"]["label"])}
    second = sentence_embedding(task, settings, flipped)
    assert second["chosen"] == first["chosen"]
    assert [t["selection"] for t in second["tried"]] == [t["selection"] for t in first["tried"]]
    assert second["metrics"]["dev"]["pearson"] == pytest.approx(-first["metrics"]["dev"]["pearson"])
    # the weights and intercept of a ridge regression on the chosen features
    width = 32 * (4 if best["features"].startswith("[u, v") else 2) + (0 if best["features"].startswith("[u") else 1)
    assert first["trainable_parameters"] == width + 1


def test_the_peers_that_train_no_encoder_read_one_encoding_of_the_task(tiny_bert, tmp_path):
    """The embed stage encodes the task once; the linear model reading its file chooses and scores
    exactly as it does encoding the texts itself, and its record says the encoding was shared (its
    job's seconds then count in the peer's whole cost). A file of other rows is refused."""
    from bertvision.config.settings import FinetuneCompute
    from bertvision.layout import split_file
    from bertvision.stages.peer import embed_task

    task = get_task("stsb")
    rows = {"train": stsb_rows(30), "selection": stsb_rows(10, 30), "dev": stsb_rows(10, 40)}
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, frame in rows.items():
        frame.to_parquet(split_file(raw, split))
    shared = {"batch_size": 8, "max_length": 64, "backend": "torch"}
    out = tmp_path / "peers" / "embeddings.npz"
    compute = FinetuneCompute(device="cpu", precision="fp32")
    embed_task(task, "tiny", settings_of(tiny_bert, {"method": "cosine", **shared}), compute, raw, out)

    linear = settings_of(tiny_bert, {"method": "embedding", "regularization": [0.1, 1.0], **shared})
    alone, read = sentence_embedding(task, linear, rows), sentence_embedding(task, linear, rows, embeddings=out)
    assert read["chosen"] == alone["chosen"]
    assert [t["selection"] for t in read["tried"]] == pytest.approx([t["selection"] for t in alone["tried"]])
    assert read["metrics"]["dev"]["pearson"] == pytest.approx(alone["metrics"]["dev"]["pearson"], abs=1e-6)
    assert (read["shared_encoding"], alone["shared_encoding"]) == (True, False)
    with pytest.raises(ValueError, match="run embed again"):
        sentence_embedding(task, linear, {**rows, "dev": rows["dev"].iloc[:-1]}, embeddings=out)


def test_bitfit_and_lora_leave_only_their_parameters_trainable(tiny_bert):
    from bertvision.config.settings import LoraPeer
    from bertvision.peers.adapted import bitfit, lora, trainable_parameters
    from bertvision.training.encoder import load_classifier

    task = get_task("mrpc")
    model = bitfit(load_classifier(task, str(tiny_bert), seed=1))
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(n.endswith(".bias") or n.startswith("classifier.") for n in trained)
    assert "classifier.weight" in trained and not any(n.endswith("query.weight") for n in trained)
    biases = sum(p.numel() for n, p in model.bert.named_parameters() if n.endswith(".bias"))
    assert trainable_parameters(model) == biases + 32 * 2 + 2  # every encoder bias + the 2-class head
    settings = LoraPeer(method="lora", rank=4, alpha=8, dropout=0.0, target_modules=("query", "value"),
                        learning_rates=(1e-3,), epochs=1)  # fmt: skip
    model = load_classifier(task, str(tiny_bert), seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing in a LoRA job's log that its user cannot act on
        adapted = lora(settings, task)(model)
    # 2 layers x (query, value) x (A: 32 x 4 + B: 4 x 32), and the new head trained whole
    assert trainable_parameters(adapted) == 2 * 2 * (32 * 4 + 4 * 32) + (32 * 2 + 2)
    config = adapted.peft_config["default"]
    assert (config.r, config.lora_alpha, config.task_type) == (4, 8, "SEQ_CLS")
    # a question task's adapters keep its span head trained whole (peft's task type for it)
    squad = get_task("squad2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spans = lora(settings, squad)(load_classifier(squad, str(tiny_bert), seed=1))
    assert spans.peft_config["default"].task_type == "QUESTION_ANS"
    assert trainable_parameters(spans) == 2 * 2 * (32 * 4 + 4 * 32) + (32 * 2 + 2)  # qa_outputs: start, end


def test_which_peers_apply_to_which_task():
    names = ["embedding", "cosine", "lora", "bitfit", "setfit"]
    assert applicable(names, get_task("sst2")) == ["embedding", "lora", "bitfit", "setfit"]
    assert applicable(names, get_task("mrpc")) == ["embedding", "lora", "bitfit"]
    assert applicable(names, get_task("stsb")) == ["embedding", "cosine", "lora", "bitfit"]
    assert applicable(names, get_task("squad2")) == ["lora", "bitfit"]
    why = inapplicable(names, get_task("squad2"))
    assert set(why) == {"embedding", "cosine", "setfit"} and "question task" in why["embedding"]


def test_the_cosine_peer_needs_a_pair_and_only_the_encoding_peers_read_embeddings():
    """A regression over single texts has no two embeddings to take the cosine of; the peers that
    train the encoder read no shared encoding of the task."""
    import dataclasses

    from bertvision.registry.peers import PEERS

    stsb = get_task("stsb")
    one_text = dataclasses.replace(stsb, text_fields=stsb.text_fields[:1])
    assert applicable(["embedding", "cosine"], one_text) == ["embedding"]
    assert "text pairs only" in inapplicable(["cosine"], one_text)["cosine"]
    assert {name for name, peer in PEERS.items() if peer.reads_embeddings} == {"embedding", "cosine"}


def test_the_config_names_the_peers_per_task_and_their_seeds():
    s = workflow_settings(
        tasks={"mrpc": None, "stsb": {"peers": ["cosine", "lora"]}},
        baseline={"seeds": [3, 4]},
    )
    # the schema's default: the two that cost one encoding pass (the cosine needs a regression),
    # each where it applies
    assert s.configured_peers("mrpc") == ["embedding", "cosine"] and s.peers("mrpc") == ["embedding"]
    assert s.configured_peers("stsb") == ["cosine", "lora"] and s.peers("stsb") == ["cosine", "lora"]
    # the peers that train take the baseline's seeds; the ones that do not depend on one run once
    assert s.peer_seeds("lora") == [3, 4] and s.peer_seeds("embedding") == s.peer_seeds("cosine") == [0]
    # whatever the seeds: a change of them reruns no peer that does not depend on one
    assert workflow_settings(tasks={"mrpc": None}, baseline={"seeds": [7]}).peer_seeds("embedding") == [0]
    lora = s.peer("m", "mrpc", "lora")
    assert lora.method.learning_rates == (1e-3, 5e-3) and lora.optimizer.batch_size == 32
    assert s.peer("m", "stsb", "cosine").optimizer is None


# --- the summary, worked by hand ----------------------------------------------------------------


def write_peer(root: Path, peer: str, label: str, seed: int, selection: float, dev: float, own: float,
               job: float, deterministic: bool = False, params: int = 50,
               embed_job: float | None = None) -> Path:  # fmt: skip
    """``embed_job``: the seconds of the task's shared encoding, which the peer read (None: it read none)."""
    from tests.test_whole_cost import MODEL, TASK, write_benchmark, write_json

    metrics = {"selection": {"accuracy": selection, "f1": selection}, "dev": {"accuracy": dev, "f1": dev,
                                                                               "constant_score": 0.5}}  # fmt: skip
    record = {"task": TASK, "model": MODEL, "peer": peer, "label": label, "seed": seed,
              "deterministic": deterministic, "metrics": metrics, "trainable_parameters": params,
              "encoder_parameters": 1000, "train_seconds": own, "device": "cpu", "precision": "fp32",
              "shared_encoding": embed_job is not None}  # fmt: skip
    write_benchmark(peer_job(MODEL, TASK, peer, seed), job)
    if embed_job is not None:
        write_benchmark(Job("embed", {"task": TASK, "model": MODEL}), embed_job)
    return write_json(root / PEER_FILE.format(model=MODEL, task=TASK, peer=peer, seed=seed, file=PEER_METRICS), record)


def test_the_peers_rows_and_whole_cost_worked_by_hand(tmp_path, monkeypatch):
    """The hand-worked records of tests/test_whole_cost.py (the pick: ap at 0.3, selection 0.80,
    dev 0.75 on every seed, whole cost 101.25 s; full fine-tuning 135 s) with two peers: the
    embedding's linear model (one run: selection 0.90, dev 0.85, its job 4 s after the task's shared
    encoding's 6 s) and LoRA (two seeds: selection 0.78, dev 0.79 and 0.81, jobs 50 and 60 s)."""
    from bertvision.stages.tables import build_tables
    from tests.test_whole_cost import SHARDS, HandWorked

    monkeypatch.chdir(tmp_path)
    r = HandWorked(Path("."))
    peers = [
        write_peer(
            Path("."), "embedding", "embedding + linear", 1, 0.90, 0.85, 3.0, 4.0, deterministic=True, embed_job=6.0
        ),
        write_peer(Path("."), "lora", "LoRA", 1, 0.78, 0.79, 40.0, 50.0, params=74),
        write_peer(Path("."), "lora", "LoRA", 2, 0.78, 0.81, 44.0, 60.0, params=74),
    ]
    out = tmp_path / "results" / "tables"
    build_tables(r.bert, r.head_dirs, r.manifests, r.runs, SHARDS, ["lp", "ap"], out, r.baselines, r.workers,
                 peer_metrics=peers, peers={"mrpc": ["embedding", "lora", "setfit"]})  # fmt: skip
    summary = pd.read_csv(out / "summary.csv")
    rows = summary[summary["row"] == "peer"].set_index("model")
    assert list(summary["row"][:3]) == ["full fine-tuning", "peer", "peer"]  # the peers right after the bar
    embedding, lora = rows.loc["embedding + linear"], rows.loc["LoRA"]
    # whole: the peer's own jobs, every setting it tried (4 + the shared encoding's 6; 50 and 60);
    # own: the records' seconds
    assert (embedding["whole_seconds"], embedding["n"], bool(embedding["deterministic"])) == (10.0, 1, True)
    assert lora["whole_seconds"] == pytest.approx(55.0) and lora["whole_seconds_std"] == pytest.approx(np.sqrt(50))
    assert lora["seconds"] == pytest.approx(42.0) and lora["whole_cost_ratio"] == pytest.approx(55 / 135, rel=1e-5)
    assert lora["parameter_percent"] == pytest.approx(7.4)
    assert lora["score_diff"] == pytest.approx(0.80 - 0.81)  # dev 0.80 vs full fine-tuning's 0.80 and 0.82
    md = (out / "summary.md").read_text()
    # the embedding is the best on selection; the pick scored 0.75 on every seed: its spread is unmeasured
    assert (
        "**embedding + linear (peer) is the best method on the selection split**; the BERTVision pick, `ap` on the "
        "0.3-epoch checkpoint, is undetermined against it (-10.0 points; the picked path scored the same on every "
        "seed, so its spread is unmeasured), at 10.12× its whole compute." in md
    )
    assert "SetFit does not apply here: SetFit's contrastive pairs and logistic head are for single-text" in md
    methods = pd.read_csv(out / "methods.csv")
    assert set(methods["family"]) == {"full fine-tuning", "peer", "BERT at a checkpoint", "BERTVision"}
    # the embedding costs 10 s and scores 0.85: nothing is both cheaper and better
    assert methods.set_index("model").loc["embedding + linear", "on_front"]
    # the encoding is a stage of the timing table beside the peers' own jobs
    timing = pd.read_csv(out / "timing.csv")
    assert timing.set_index("stage").loc["embed", "seconds"] == pytest.approx(6.0)


def verdict_block(pick_dev: float, pick_std: float, peer_selection: float) -> pd.DataFrame:
    base = {"backbone": "m", "task": "mrpc", "budget": np.nan, "metric": "accuracy", "constant_score": 0.5,
            "best_dev_any": 0.9, "parameter_percent": 1.0, "ft_seeds": 2, "deterministic": False}  # fmt: skip
    return pd.DataFrame(
        [
            {**base, "row": "full fine-tuning", "model": "BERT", "checkpoint": np.nan, "dev_mean": 0.80,
             "dev_std": 0.01, "n": 3, "selection_mean": 0.81, "trainable_params": 1000, "whole_seconds": 100.0,
             "whole_cost_ratio": 1.0, "cost_ratio": 1.0, "score_diff_std_units": np.nan},
            {**base, "row": "peer", "model": "LoRA", "checkpoint": np.nan, "dev_mean": 0.84, "dev_std": 0.01,
             "n": 3, "selection_mean": peer_selection, "trainable_params": 7, "whole_seconds": 80.0,
             "whole_cost_ratio": 0.8, "cost_ratio": 0.8, "score_diff_std_units": np.nan},
            {**base, "row": "BERTVision (picked)", "model": "lp", "checkpoint": 0.0, "dev_mean": pick_dev,
             "dev_std": pick_std, "n": 3, "selection_mean": 0.83, "trainable_params": 1, "whole_seconds": 40.0,
             "whole_cost_ratio": 0.4, "cost_ratio": 0.3, "score_diff_std_units": np.nan},
        ]
    )  # fmt: skip


def test_a_pick_that_loses_to_a_peer_says_so_first():
    from bertvision.reporting.verdict import verdict

    text = verdict(verdict_block(0.78, 0.01, peer_selection=0.85))
    assert text.startswith(
        "**LoRA (peer) beats the BERTVision pick**: `lp` on the 0-epoch checkpoint trails it by 6.0 points on dev"
    )
    assert "at 0.50× its whole compute; LoRA (peer) is also the best method on the selection split." in text
    assert "Against full fine-tuning: **trails full fine-tuning by 2.0 points**" in text
    # the pick best on selection but behind LoRA on dev beyond the spread: the loss comes first
    ahead_on_selection = verdict(verdict_block(0.78, 0.01, peer_selection=0.82))
    assert ahead_on_selection.startswith("**LoRA (peer) beats the BERTVision pick**")
    assert "; the pick scored best on the selection split." in ahead_on_selection
    within = verdict(verdict_block(0.83, 0.01, peer_selection=0.85))
    assert within.startswith("**LoRA (peer) is the best method on the selection split**; the BERTVision pick")
    assert "is within noise of it" in within
    best = verdict(verdict_block(0.86, 0.01, peer_selection=0.82))
    assert best.startswith("**The BERTVision pick is the best method on the selection split**")
    # the best other method on selection is LoRA (0.82) over full fine-tuning (0.81)
    assert "against the best other method, LoRA (peer), it is ahead of it by 2.0 points on dev" in best


def test_a_row_at_the_constant_prediction_is_named_as_learning_nothing():
    """A peer that predicts one class (SST-2 BitFit at 0.503 against the constant's 0.509) read as
    an ordinary method; where every row is at the constant, the verdict says so instead."""
    from bertvision.reporting.verdict import unlearned_line

    block = verdict_block(0.78, 0.01, peer_selection=0.85)
    assert unlearned_line(get_task("mrpc"), block) == ""
    block.loc[block["model"] == "LoRA", "dev_mean"] = 0.51
    assert unlearned_line(get_task("mrpc"), block) == (
        "No better than predicting the same class every time (within 0.02 accuracy of it): LoRA (peer) 0.51; "
        "such a run learned nothing, whatever its method can do."
    )
    block["dev_mean"] = 0.5
    assert unlearned_line(get_task("mrpc"), block) == ""


def test_the_tables_of_peers_alone(tmp_path, monkeypatch):
    """A run of the peer rules alone (no checkpoint, head or baseline): the summary and the
    methods table hold their rows, the other tables say there is nothing."""
    from bertvision.stages.tables import build_tables

    monkeypatch.chdir(tmp_path)
    peers = [write_peer(Path("."), "embedding", "embedding + linear", 1, 0.7, 0.72, 3.0, 10.0, deterministic=True)]
    out = tmp_path / "tables"
    build_tables([], [], [], [], 1, [], out, peer_metrics=peers, peers={"mrpc": ["embedding", "cosine"]})
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["row"]) == ["peer"] and summary["whole_seconds"].iloc[0] == 10.0
    assert "embedding cosine does not apply here" in (out / "summary.md").read_text()
    assert pd.read_csv(out / "methods.csv")["on_front"].all()


def test_texts_are_batched_by_their_token_counts_each_distinct_text_once(tiny_bert):
    """Two texts of 5 tokens and two of 8, whose lengths in characters pair a short one with a long
    one: batched two at a time by token count, no batch holds padding; a repeated text is encoded
    once; each row is its text's embedding as encoded alone."""
    from transformers import AutoModel, AutoTokenizer

    texts = ["photosynthesis", "a b c d e f", "it is a", "g h i j k l", "it is a"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    counts = {t: len(tokenizer(t)["input_ids"]) for t in texts}
    assert counts == {"photosynthesis": 5, "a b c d e f": 8, "it is a": 5, "g h i j k l": 8}
    assert sorted(counts, key=len) == ["it is a", "a b c d e f", "g h i j k l", "photosynthesis"]
    encoded = emb.encode_texts(str(tiny_bert), texts, 64, 2)
    assert encoded.real_tokens == encoded.padded_tokens == 5 + 5 + 8 + 8
    # in the order of their characters two batches would each pad a 5-token text to 8
    interleaved = emb.encode_texts(str(tiny_bert), ["a b c d e f", "it is a", "m n o p q r", "photosynthesis"], 64, 2)
    assert interleaved.real_tokens == interleaved.padded_tokens == 5 + 5 + 8 + 8
    padded = emb.encode_texts(str(tiny_bert), ["it is a", "m n o p q r"], 64, 2)  # one batch: 5 tokens padded to 8
    assert (padded.real_tokens, padded.padded_tokens) == (5 + 8, 8 + 8)
    model = AutoModel.from_pretrained(tiny_bert).eval()
    with torch.inference_mode():
        alone = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0].mean(0).numpy() for t in texts]
    np.testing.assert_allclose(encoded.vectors, np.stack(alone), atol=1e-5)


def test_a_peer_a_task_names_that_cannot_run_on_it_is_refused_by_its_key():
    """peers.methods runs each peer where it applies; a task's own list that names one that cannot
    run on it (it was planned, silently, as nothing) fails as a wrong head does."""
    from bertvision.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        workflow_settings(tasks={"stsb": {"peers": ["cosine", "setfit"]}, "sst2": {"peers": ["cosine"]}})
    lines = str(err.value).splitlines()
    assert any("tasks.stsb.peers: setfit does not apply to stsb: SetFit's contrastive pairs" in line for line in lines)
    assert any(
        "tasks.sst2.peers: cosine does not apply to sst2: the cosine of two embeddings" in line for line in lines
    )
    assert not any("stsb.peers: cosine" in line for line in lines)


def test_a_grid_that_repeats_a_value_is_refused():
    """A learning rate given twice trained the same run twice (as long as full fine-tuning)."""
    from bertvision.config.schema import validate_config
    from bertvision.errors import ConfigError

    for section, key in (("lora", "learning_rates"), ("bitfit", "learning_rates"), ("setfit", "learning_rates"),
                         ("embedding", "regularization"), ("lora", "target_modules")):  # fmt: skip
        values = ["query", "query"] if key == "target_modules" else [5e-3, 0.005]
        config = {"tasks": {"mrpc": None}, "peers": {section: {key: values}}}
        with pytest.raises(ConfigError, match=rf"peers.{section}.{key}: .* has non-unique elements"):
            validate_config(config)


def test_full_fine_tunings_learning_rate_reruns_no_peer():
    """LoRA's and BitFit's runs take full fine-tuning's optimizer but for the learning rate, which
    their grid sets: a change of full fine-tuning's leaves their settings (the jobs' params) as
    they were, and changes full fine-tuning's."""
    first = workflow_settings(baseline={"settings": {"learning_rate": 1e-4}})
    other = workflow_settings(baseline={"settings": {"learning_rate": 5e-5}})
    assert first.baseline("m", "mrpc").to_json() != other.baseline("m", "mrpc").to_json()
    for peer in ("lora", "bitfit"):
        settings = first.peer("m", "mrpc", peer)
        assert settings.to_json() == other.peer("m", "mrpc", peer).to_json()
        assert settings.optimizer.learning_rate == settings.method.learning_rates[0]
    more_steps = workflow_settings(baseline={"settings": {"batch_size": 8}})
    assert more_steps.peer("m", "mrpc", "lora").optimizer.batch_size == 8  # the rest is full fine-tuning's


def test_lora_on_modules_the_encoder_lacks_fails_naming_the_key(tiny_bert):
    """peft's refusal was a traceback in the job's log naming no config key."""
    from bertvision.config.settings import LoraPeer
    from bertvision.errors import ConfigError
    from bertvision.peers.adapted import lora
    from bertvision.training.encoder import load_classifier

    task = get_task("mrpc")
    settings = LoraPeer(method="lora", rank=4, alpha=8, dropout=0.0, target_modules=("q_proj", "value"),
                        learning_rates=(1e-3,), epochs=1)  # fmt: skip
    with pytest.raises(ConfigError) as err:
        lora(settings, task)(load_classifier(task, str(tiny_bert), seed=1))
    assert str(err.value).startswith("peers.lora.target_modules: ['q_proj'] name no module of the encoder; ")
    assert "query" in str(err.value) and "value" in str(err.value)


def test_the_linear_peers_strength_is_c_and_ties_keep_the_first_features_and_the_stronger_regularisation():
    """C is the inverse strength: Ridge takes alpha = 1 / C. A selection scorer that ties every
    choice gets the first feature set at the smallest C (the docstring's rule); mutants reversing
    either passed every test."""
    stsb, sst2 = get_task("stsb"), get_task("sst2")
    assert emb.linear_model(stsb, 10.0).alpha == pytest.approx(0.1) and emb.linear_model(sst2, 10.0).C == 10.0
    rng = np.random.default_rng(0)
    features = {split: {"first": rng.normal(size=(20, 3)), "second": rng.normal(size=(20, 3))}
                for split in ("train", "selection")}  # fmt: skip
    labels = {split: rng.integers(0, 2, 20) for split in ("train", "selection")}
    _, chosen, tried = emb.fit_on_selection(sst2, features, labels, [10.0, 0.1, 1.0], lambda outputs, split: 0.5)
    assert chosen["features"] == "first" and chosen["regularization"] == 0.1
    assert [(t["features"], t["regularization"]) for t in tried][:3] == [
        ("first", 0.1),
        ("first", 1.0),
        ("first", 10.0),
    ]


def test_the_verdict_weighs_each_comparison_with_its_own_interval():
    """The pick ahead of LoRA (the rival on selection) by 4 points whose interval excludes 0, and of
    full fine-tuning by 2 whose interval holds it: each sentence reads its own interval (a mutant
    swapping them passed every test)."""
    from bertvision.reporting.verdict import verdict

    block = verdict_block(0.82, 0.001, peer_selection=0.85)  # LoRA best on selection, dev 0.84 ... the pick 0.82
    block.loc[block["model"] == "LoRA", "dev_mean"] = 0.78
    picked = block["row"] == "BERTVision (picked)"
    block.loc[picked, ["score_diff_low", "score_diff_high", "rival_diff_low", "rival_diff_high", "dev_rows"]] = [
        -0.01, 0.05, 0.01, 0.07, 400
    ]  # fmt: skip
    words = verdict(block)
    assert "the BERTVision pick, `lp` on the 0-epoch checkpoint, is ahead of it by 4.0 points on dev" in words
    assert "gives +1.0 to +7.0 points" in words
    assert "Against full fine-tuning: **within noise of full fine-tuning** (+2.0 points" in words
    assert "gives -1.0 to +5.0 points" in words


def test_no_winner_only_when_neither_the_pick_nor_the_rival_clears_the_constant_beyond_noise():
    """The pick's score within dev's noise of the constant, the rival's clear of it: the task was
    learned, by the rival (a mutant that needed one side only passed every test)."""
    from bertvision.reporting.verdict import verdict

    block = verdict_block(0.78, 0.01, peer_selection=0.85)
    block["score_low"], block["dev_rows"] = [0.7, 0.72, 0.45], 400  # the pick's bootstrap reaches 0.5
    assert "no model learned" not in verdict(block)
    block["score_low"] = 0.45
    assert "no model learned" in verdict(block)


@pytest.mark.parametrize("mode", ["lasttoken", "cls", "weightedmean"])
def test_a_tokenizer_that_pads_on_the_left_embeds_as_one_that_pads_on_the_right(tiny_bert, tmp_path, mode):
    """Pooling reads each text's tokens from the left of its row (its first token, its last real
    one, their positions): the embedding pads on the right whatever side the backbone's tokenizer
    config asks for, so a layout that pads on the left embeds each text as it does alone."""
    import shutil

    texts = ["a short one", "a rather longer text than the first", "mid length text"]
    embedded = {}
    for side in ("right", "left"):
        folder = tmp_path / side
        shutil.copytree(tiny_bert, folder)
        st_layout(folder, {"pooling_mode": mode}, normalize=False)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": side}))
        embedded[side] = emb.encode_texts(str(folder), texts, 32, 8).vectors
        alone = [emb.encode_texts(str(folder), [text], 32, 1).vectors[0] for text in texts]
        np.testing.assert_allclose(embedded[side], np.stack(alone), atol=1e-5, err_msg=side)
    np.testing.assert_allclose(embedded["left"], embedded["right"], atol=1e-5)


def test_a_layout_normalizes_without_pooling_declares_no_mode_or_a_module_not_run(tmp_path, caplog):
    """A layout without a Pooling module still normalizes where it says so; a Pooling config that
    lists no mode is refused naming its file; a module the embedding does not run (a Dense
    projection) is named in a warning, its vectors not sentence-transformers'."""
    import logging

    folder = tmp_path / "normalize-only"
    folder.mkdir()
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))  # fmt: skip
    normalized = declared_pooling(str(folder))
    assert (normalized.modes, normalized.normalize) == (("mean",), True)
    none = st_layout(tmp_path / "none", {"pooling_mode": []}, normalize=False)
    with pytest.raises(ValueError, match=r"1_Pooling/config.json: pooling none is not one of cls, max"):
        declared_pooling(str(none))
    dense = st_layout(tmp_path / "dense", {"pooling_mode": "cls"}, normalize=True)
    modules = json.loads((dense / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with caplog.at_level(logging.WARNING):
        projected = declared_pooling(str(dense))
    assert (projected.modes, projected.normalize) == (("cls",), True)
    assert "modules Dense are not applied" in caplog.text


def test_a_peer_jobs_record_holds_its_choice_and_its_selection_score(tiny_bert, tmp_path):
    """``run_peer``'s record: the peer, its seed, the choice it made on selection and the score it
    made it on (the selection split's, never dev's), beside its predictions of every scored split."""
    from bertvision.config.settings import FinetuneCompute
    from bertvision.layout import split_file
    from bertvision.stages.peer import run_peer

    task = get_task("stsb")
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, frame in {"train": stsb_rows(30), "selection": stsb_rows(10, 30), "dev": stsb_rows(10, 40)}.items():
        frame.to_parquet(split_file(raw, split))
    linear = settings_of(tiny_bert, {"method": "embedding", "regularization": [0.1, 1.0], "batch_size": 8,
                                     "max_length": 64, "backend": "torch"})  # fmt: skip
    out = tmp_path / "peer"
    run_peer(task, "tiny", linear, FinetuneCompute(device="cpu", precision="fp32"), tmp_path, raw, out, 0, threads=1)
    record = json.loads((out / PEER_METRICS).read_text())
    assert (record["task"], record["model"], record["peer"], record["seed"]) == ("stsb", "tiny", "embedding", 0)
    assert record["selection_score"] == record["metrics"]["selection"]["pearson"] != record["metrics"]["dev"]["pearson"]
    best = max(record["tried"], key=lambda t: t["selection"])
    assert record["chosen"] == {"features": best["features"], "regularization": best["regularization"]}
    predictions = pd.read_parquet(out / PEER_PREDICTIONS)
    assert set(predictions["split"]) == {"selection", "dev"}


def test_the_verdicts_bounds_hold_their_edges():
    """Each of the verdict's bounds at its edge, in binary-exact numbers (mutants making each strict
    passed every test): the best score anywhere exactly the learning bar above the constant (0.5 +
    0.02) learned nothing; the pick 0.875 ± 0.0625 against full fine-tuning's 0.75 ± 0.0625 has
    ranges that touch, so it is within noise; beyond the seeds' spread, a bootstrap interval whose
    low end is exactly 0 (a paired percentile lands on 0 where the sides differ on few rows) holds
    no difference."""
    from bertvision.reporting.verdict import verdict

    at_bar = verdict_block(0.52, 0.01, peer_selection=0.85)
    at_bar["dev_mean"], at_bar["best_dev_any"] = 0.52, 0.52
    assert "**no model learned this task**: no model tried" in verdict(at_bar)
    at_bar["best_dev_any"] = 0.5201
    assert "no model learned" not in verdict(at_bar)

    touching = verdict_block(0.875, 0.0625, peer_selection=0.82)
    touching.loc[touching["row"] == "full fine-tuning", ["dev_mean", "dev_std"]] = [0.75, 0.0625]
    assert (
        "Against full fine-tuning: **within noise of full fine-tuning** (+12.5 points; the two mean ± std ranges "
        "overlap)" in verdict(touching)
    )

    zero_low = verdict_block(0.82, 0.001, peer_selection=0.82)  # +2.0 points on full fine-tuning, beyond 0.011
    picked = zero_low["row"] == "BERTVision (picked)"
    zero_low.loc[picked, ["score_diff_low", "score_diff_high", "dev_rows"]] = [0.0, 0.05, 400]
    assert (
        "Against full fine-tuning: **within noise of full fine-tuning** (+2.0 points, beyond the seeds' spread, "
        "2.0 of its std, but a 95% paired bootstrap over dev's 400 rows gives +0.0 to +5.0 points)" in verdict(zero_low)
    )
