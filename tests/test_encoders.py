"""Any encoder AutoModel loads: BERT, RoBERTa, DistilBERT, ELECTRA and DeBERTa-v2, each a tiny
random model with a real-vocab tokenizer (tests/tiny_encoders.py), through one real Snakemake
run (fine-tune, extract, heads, tables) and, for RoBERTa, a span task and the serving engine.
What each architecture takes (token type ids, the pooler keyword, the summary token's place, the
number of hidden states) is asked of it, never assumed from BERT."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, SHIPPED_GLUE, snakemake, squad_slice, workflow_settings
from tests.tiny_encoders import FAMILIES, HEADS, HIDDEN, LAYERS, make_tiny_encoder, template_tokenizer

SQUAD = REPO / "resources" / "squad2"
# family -> (its model classes' prefix, whether token type ids go in)
EXPECTED = {
    "bert": ("Bert", True),
    "roberta": ("Roberta", False),
    "distilbert": ("DistilBert", False),
    "electra": ("Electra", True),
    "deberta-v2": ("DebertaV2", True),
}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("encoders")
    return {family: make_tiny_encoder(family, root / family) for family in FAMILIES}


def tokenizer_of(path):
    from bertvision.models.backbone import load_tokenizer

    return load_tokenizer(str(path))


# --- what each architecture takes, asked of it --------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_loads_bare_and_says_what_it_takes(encoders, family):
    import torch

    from bertvision.models.encoder_io import (
        encoder_kwargs,
        hidden_state_shape,
        load_encoder,
        load_model_config,
        summary_position,
        uses_token_types,
    )

    prefix, token_types = EXPECTED[family]
    config = load_model_config(str(encoders[family]))
    model = load_encoder(str(encoders[family])).eval()  # add_pooling_layer raised a TypeError here
    assert type(model).__name__ == f"{prefix}Model" and getattr(model, "pooler", None) is None
    assert encoder_kwargs(config) == ({"add_pooling_layer": False} if family in ("bert", "roberta") else {})
    tokenizer = tokenizer_of(encoders[family])
    assert uses_token_types(tokenizer, config) is token_types
    assert summary_position(tokenizer) == 0
    enc = tokenizer("a first text", "and a second one", return_tensors="pt", return_token_type_ids=token_types)
    with torch.inference_mode():
        states = model(**enc, output_hidden_states=True).hidden_states
    assert hidden_state_shape(model) == (len(states), HIDDEN) == (LAYERS + 1, HIDDEN)


def test_a_distilbert_batch_carries_no_token_type_ids_and_a_bert_batch_does(encoders, tmp_path):
    import torch

    from bertvision.data.tokenized import TokenizedSplit, collate
    from bertvision.layout import split_file
    from bertvision.models.encoder_io import load_encoder, pad_id
    from bertvision.registry.tasks import get_task
    from bertvision.stages.download import download_task
    from bertvision.stages.tokenize import tokenize_task

    settings = workflow_settings(
        backbones={f: {"pretrained": str(encoders[f])} for f in ("bert", "distilbert")},
        tasks={"rte": {"train_size": 8, "eval_size": 8, "max_length": 48}},
    )
    task = get_task("rte")
    download_task(task, settings.download("rte"), tmp_path / "raw")
    for family, wanted in (
        ("distilbert", {"input_ids", "attention_mask"}),
        ("bert", {"input_ids", "attention_mask", "token_type_ids"}),
    ):
        tokenize_task(task, settings.tokenize(family, "rte"), tmp_path / "raw", tmp_path / family)
        split = TokenizedSplit.read(split_file(tmp_path / family, "dev"))
        model = load_encoder(str(encoders[family])).eval()
        batch = collate(split, np.arange(4), pad_id(model))
        assert set(batch) == wanted
        if family == "bert":  # the second text's type ids are 1
            assert (batch["token_type_ids"] == 1).any()
        with torch.inference_mode():  # DistilBERT's forward has no token_type_ids argument
            assert model(**batch).last_hidden_state.shape[:2] == batch["input_ids"].shape


def test_a_roberta_pair_comes_from_its_template(encoders):
    from bertvision.data.token_ids import tokenize_frame
    from bertvision.registry.tasks import get_task

    tokenizer = tokenizer_of(encoders["roberta"])
    frame = pd.DataFrame({"idx": [0], "sentence1": ["the cat sat"], "sentence2": ["a dog ran"], "label": [0]})
    ids = tokenize_frame(frame, get_task("rte"), tokenizer, 32)["input_ids"][0].tolist()
    bos, sep = tokenizer.convert_tokens_to_ids(["<s>", "</s>"])
    words = tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "a", "dog", "ran"])
    assert ids == [bos, *words[:3], sep, sep, *words[3:], sep]
    assert (bos, sep, tokenizer.pad_token_id) == (0, 2, 1)  # RoBERTa's ids, pad not 0


def test_a_tokenizer_whose_summary_token_is_last_is_refused():
    from bertvision.models.encoder_io import UnsupportedEncoderError, summary_position
    from tests.tiny_encoders import bert_vocab

    special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    xlnet_like = template_tokenizer(
        bert_vocab(),
        special,
        "$A [SEP] [CLS]",
        "$A [SEP] $B:1 [SEP]:1 [CLS]:2",
        ["input_ids", "token_type_ids", "attention_mask"],
    )
    with pytest.raises(UnsupportedEncoderError, match="position 4 of a pair, not first"):
        summary_position(xlnet_like)


def test_the_scheduler_reads_distilberts_config_names(encoders):
    from bertvision.plan.estimates import EncoderShape

    assert json.loads((encoders["distilbert"] / "config.json").read_text())["n_layers"] == LAYERS
    for family in FAMILIES:
        assert EncoderShape.of(str(encoders[family])) == EncoderShape(LAYERS, HIDDEN, 30522, HEADS)


def test_layer_norms_are_not_decayed_whatever_their_name(encoders):
    from bertvision.registry.tasks import get_task
    from bertvision.training.encoder import build_optimizer, load_classifier

    model = load_classifier(get_task("rte"), str(encoders["distilbert"]), seed=1)
    decayed, undecayed = (group["params"] for group in build_optimizer(model, 1e-4, 0.01).param_groups)
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("sa_layer_norm" in names[id(p)] for p in undecayed)
    assert not any("layer_norm" in names[id(p)] or names[id(p)].endswith("bias") for p in decayed)


# --- every family end to end through Snakemake ---------------------------------------------------
def five_backbones_config(encoders: dict) -> dict:
    return {
        "backbones": {family: {"pretrained": str(path)} for family, path in encoders.items()},
        "data": {"glue_dir": str(SHIPPED_GLUE), "squad_dir": str(SQUAD), "selection_fraction": 0.2},
        "tasks": {"rte": {"train_size": 40, "eval_size": 24, "max_length": 64}},
        "finetune": {"epoch_fractions": [1.0], "settings": {"batch_size": 8}},
        "baseline": {"enabled": False},
        "extract": {"shards": 1, "batch_size": 16},
        "heads": {
            "seeds": [1],
            "training": {"max_epochs": 2, "patience": 1, "batch_size": 16},
            "models": {"lp": {"type": "lp"}, "adapter8": {"type": "adapter", "width": 8, "skip": True}},
        },
    }


@pytest.fixture(scope="module")
def five_backbones_run(encoders, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("five-backbones")
    (workdir / "config.yaml").write_text(yaml.safe_dump(five_backbones_config(encoders)))
    snakemake(workdir)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_runs_finetune_extract_heads(five_backbones_run, encoders, family):
    import torch

    from bertvision.data.tokenized import TokenizedSplit, collate
    from bertvision.features.store import FeatureSet
    from bertvision.models.encoder_io import load_encoder, pad_id

    workdir = five_backbones_run
    prefix, token_types = EXPECTED[family]
    ckpt = workdir / f"models/{family}/rte/ft1/ckpt-1"
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == [f"{prefix}ForSequenceClassification"]
    bert = json.loads((ckpt / "eval_metrics.json").read_text())
    assert bert["step"] > 0 and 0 <= bert["metrics"]["dev"]["accuracy"] <= 1

    # the stored summary-token states are the encoder's own, fed what it takes
    tokens = TokenizedSplit.read(workdir / f"data/tokens/{family}/rte/dev.parquet")
    assert (tokens.token_type_ids is not None) is token_types
    manifest = workdir / f"features/{family}/rte/ft1/ckpt-1/manifest.json"
    features, _, idx = FeatureSet.open(manifest, "dev").read_all()
    assert features.shape == (24, LAYERS + 1, HIDDEN) and (idx == tokens.idx).all()
    model = load_encoder(str(ckpt)).eval()
    rows = np.array([0, 7])
    batch = collate(tokens, rows, pad_id(model))
    with torch.inference_mode():
        states = model(**batch, output_hidden_states=True).hidden_states
    direct = torch.stack([h[:, 0] for h in states], dim=1).numpy()
    assert np.abs(features[rows].astype("float32") - direct).max() < 1e-2

    for head in ("lp", "adapter8"):
        record = json.loads((workdir / f"heads/{family}/rte/ft1/ckpt-1/{head}/seed1/metrics.json").read_text())
        assert 0 <= record["metrics"]["dev"]["accuracy"] <= 1
        if head == "lp":
            assert len(record["layer_weights"]) == LAYERS + 1
    glue = pd.read_csv(workdir / "results/tables/glue.csv")
    assert {"BERT", "lp", "adapter8"} <= set(glue[glue["backbone"] == family]["model"])


# --- a span task and the serving engine on RoBERTa -----------------------------------------------
@pytest.fixture(scope="module")
def roberta_span_run(encoders, tmp_path_factory):
    """RoBERTa fine-tuned on a SQuAD 2.0 slice (AutoModelForQuestionAnswering), its states of
    squad2 and rte extracted, an lp head each, and a bundle of both."""
    from bertvision.registry.tasks import get_task
    from bertvision.serving.bundle_writer import write_bundle
    from bertvision.stages.download import download_task
    from bertvision.stages.tokenize import tokenize_task
    from tests.stages import extract_and_train, fine_tune

    root = tmp_path_factory.mktemp("roberta-span")
    backbone = str(encoders["roberta"])
    settings = workflow_settings(
        backbones={"roberta": {"pretrained": backbone}},
        tasks={
            "squad2": squad_slice(40, 16, 16, max_length=96, doc_stride=32, heads=["lp"]),
            "rte": {"train_size": 40, "eval_size": 16, "max_length": 64, "heads": ["lp"]},
        },
        finetune={"epoch_fractions": [1], "settings": {"batch_size": 8}, "device": "cpu", "precision": "fp32"},
        extract={"precision": "fp32", "device": "cpu", "batch_size": 8},
        heads={"models": {"lp": {"type": "lp"}}, "seeds": [1], "device": "cpu", "training": {"max_epochs": 2}},
    )
    for name in ("squad2", "rte"):
        download_task(get_task(name), settings.download(name), root / "raw" / name)
        tokenize_task(get_task(name), settings.tokenize("roberta", name), root / "raw" / name, root / "tokens" / name)
    fine_tune(settings, "roberta", "squad2", root, root / "ft")
    for name in ("squad2", "rte"):
        extract_and_train(settings, "roberta", name, root, root / "ft" / "ckpt-1", root)
    bundle = write_bundle(
        root / "bundle",
        root / "ft" / "ckpt-1",
        backbone,
        {
            "squad2": {"heads_dirs": [root / "heads" / "squad2"], "max_length": 96, "doc_stride": 32},
            "rte": {"heads_dirs": [root / "heads" / "rte"], "max_length": 64},
        },
        {"backbone": "roberta", "encoder": "ft1/ckpt-1", "ft_seed": 1},
        "fp32",
    )
    return root, bundle


@pytest.mark.slow
def test_roberta_learns_spans_and_its_bundle_answers_as_the_pipeline(roberta_span_run):
    from bertvision.layout import HEAD_PREDICTIONS, head_run_dir
    from bertvision.models.head_io import load_head
    from bertvision.serving.engine import Engine
    from bertvision.serving.items import QuestionItem, TextItem
    from tests.rounding import assert_close_within_rounding, float32_states, rounding_bound, span_tolerances

    root, bundle = roberta_span_run
    ckpt = root / "ft" / "ckpt-1"
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["RobertaForQuestionAnswering"]
    assert "f1" in json.loads((ckpt / "eval_metrics.json").read_text())["metrics"]["dev"]
    assert (bundle.layers, bundle.hidden) == (LAYERS + 1, HIDDEN)

    engine = Engine(bundle, "cpu", max_chunk_rows=0)  # every sequence in one forward call
    questions = pd.read_parquet(root / "raw" / "squad2" / "dev.parquet")
    spans = pd.read_parquet(head_run_dir(root / "heads" / "squad2", "lp", 1) / HEAD_PREDICTIONS)
    spans = spans[spans["split"] == "dev"].set_index("id").loc[questions["id"]]
    pairs = pd.read_parquet(root / "raw" / "rte" / "dev.parquet")
    labels = pd.read_parquet(head_run_dir(root / "heads" / "rte", "lp", 1) / HEAD_PREDICTIONS)
    labels = labels.set_index("idx").loc[pairs["idx"]]
    texts, answers = engine.predict(
        [TextItem((a, b), {"rte": "lp"}) for a, b in zip(pairs["sentence1"], pairs["sentence2"])],
        [QuestionItem(q, c, {"squad2": "lp"}) for q, c in zip(questions["question"], questions["context"])],
    )
    assert engine.encoder_passes == 1
    # one batch here, length-sorted batches of 8 in the pipeline: equal up to float16 rounding
    tokens = {task: root / "tokens" / task / "dev.parquet" for task in ("rte", "squad2")}
    head = {task: load_head(bundle.tasks[task].heads["lp"].dir, LAYERS + 1, HIDDEN, 2) for task in tokens}
    bound = rounding_bound(head["rte"], *float32_states(bundle.encoder_dir, tokens["rte"], "cls"))
    position = {int(i): k for k, i in enumerate(pd.read_parquet(tokens["rte"], columns=["idx"])["idx"])}
    bound = bound[[position[int(i)] for i in pairs["idx"]]]
    want = np.stack(labels["outputs"].to_numpy())
    assert_close_within_rounding([t["rte"].outputs for t in texts], want, bound, rtol=1e-4, atol=1e-4, what="rte")
    squad = bundle.tasks["squad2"]
    contexts = list(questions["context"])
    tolerances = span_tolerances(
        head["squad2"], bundle.encoder_dir, tokens["squad2"], contexts, squad.max_answer_length, atol=1e-4
    )
    for answer, best, diff, (tolerance, near_best) in zip(answers, spans["best_span"], spans["score_diff"], tolerances):
        assert answer["squad2"].best_span == best or {answer["squad2"].best_span, best} <= near_best
        assert answer["squad2"].score_diff == pytest.approx(diff, abs=tolerance)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_vocabulary_gives_the_serving_backend_check_its_probe_texts(encoders, family):
    """Word-piece, byte-level (Ġ) and SentencePiece (▁) vocabularies alike: whole words, no marks."""
    from transformers import AutoTokenizer

    from bertvision.serving.backend_check import PROBE_WORDS, PROBES, probe_texts

    texts = probe_texts(AutoTokenizer.from_pretrained(str(encoders[family])))
    assert len(texts) == PROBES and all(len(t.split()) == PROBE_WORDS for t in texts)
    words = {w for t in texts for w in t.split()}
    assert len(words) > 1 and all(w.isalpha() and w.islower() for w in words), words


@pytest.mark.parametrize("mark", ["Ġ", "▁"])
def test_a_vocabulary_that_marks_a_words_start_gives_probe_texts_without_the_mark(mark):
    """Byte-level BPE (RoBERTa, GPT-2: Ġ) and SentencePiece (DeBERTa-v2, XLM-R: ▁) vocabularies."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from bertvision.serving.backend_check import probe_texts

    words = ["house", "river", "green", "walked"]
    pieces = ["<s>", "</s>", "<unk>", mark, *(mark + w for w in words), "ing", "##ed"]
    if mark == "Ġ":
        model = models.BPE({p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>")
    else:
        model = models.Unigram([(p, -1.0) for p in pieces], unk_id=2)
    texts = probe_texts(PreTrainedTokenizerFast(tokenizer_object=Tokenizer(model)))
    assert {w for t in texts for w in t.split()} <= set(words) and len({w for t in texts for w in t.split()}) > 1


def test_the_recorded_encoder_size_leaves_out_the_pooler_whichever_model_computed_the_states(tiny_bert):
    from bertvision.models.encoder_io import bare_encoder_parameter_count, load_encoder, load_task_model

    bare = load_encoder(str(tiny_bert))
    size = sum(p.numel() for p in bare.parameters())
    assert bare_encoder_parameter_count(bare) == size
    for kind in ("classification", "span"):
        assert bare_encoder_parameter_count(load_task_model(str(tiny_bert), kind)) == size
