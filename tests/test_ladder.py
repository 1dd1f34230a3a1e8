"""The ladder side network (type ladder): output shapes per example and per token, padding that
never changes an output, the parameter count it reports, training on stored token features to
a signal that needs tokens to interact, and its place in the registry and the config rules."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
import transformers

from bertvision.config.schema import validate_config
from bertvision.errors import ConfigError
from bertvision.models.encoder_io import encoder_layers, load_encoder
from bertvision.models.heads import Standardized, build_head, count_parameters, span_logits
from bertvision.models.ladder import LadderHead
from bertvision.registry.heads import HEAD_TYPES, get_head_type, trains_on
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
from bertvision.training.span import SpanProblem
from tests.conftest import SHIPPED_SQUAD
from tests.stages import with_training
from tests.test_token_head import RUNTIME, SETTINGS, planted_token_features, settings
from tests.tiny_bert import make_tiny_bert

POOLS = get_head_type("ladder").options["pool"].choices


def randomized_ladder(pool="mean", layers=4, hidden=32, outputs=3, **options) -> LadderHead:
    torch.manual_seed(0)
    head = build_head({"type": "ladder", "pool": pool, "reduction": 4, **options}, layers, hidden, outputs)
    with torch.no_grad():  # away from the even gates and the zero query
        head.gate_logits.normal_()
        if pool == "attention":
            head.query.normal_(std=3.0)
    return head.eval()


def padded_batch(lengths, layers=4, hidden=32, extra=0, fill=0.0, seed=0):
    """x (B, T, L, H) with every example's real tokens first; positions past a length hold ``fill``."""
    rng = np.random.default_rng(seed)
    width = max(lengths) + extra
    x = torch.full((len(lengths), width, layers, hidden), fill)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.from_numpy(rng.normal(size=(n, layers, hidden)).astype(np.float32))
        mask[i, :n] = True
    return x, mask


@pytest.mark.parametrize("pool", POOLS)
def test_shapes_per_example_and_per_token(pool):
    head = randomized_ladder(pool)
    x, mask = padded_batch([5, 3, 7])
    assert head(x, mask).shape == (3, 3)
    assert head(x, mask, True).shape == (3, 7, 3)
    assert head(x).shape == (3, 3)  # no mask: every position is real
    with pytest.raises(ValueError, match=r"expected \(batch, tokens, layers, hidden\).*token_features"):
        head(x[:, 0])


@pytest.mark.parametrize("pool", POOLS)
def test_padding_never_changes_the_output(pool):
    """More padding, padding that holds garbage (even inf), or a different batch: the same outputs."""
    head = randomized_ladder(pool)
    lengths = [5, 2, 7]
    x, mask = padded_batch(lengths)
    with torch.no_grad():
        alone = torch.cat([head(x[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(lengths)])
        tokens_alone = [head(x[i : i + 1, :n], mask[i : i + 1, :n], True)[0] for i, n in enumerate(lengths)]
        for extra, fill in ((0, 0.0), (6, 1e3), (3, float("inf"))):
            xp, mp = padded_batch(lengths, extra=extra, fill=fill)
            assert torch.allclose(head(xp, mp), alone, atol=1e-5), (extra, fill)
            per_token = head(xp, mp, True)
            for i, n in enumerate(lengths):
                assert torch.allclose(per_token[i, :n], tokens_alone[i], atol=1e-5)
                assert torch.isfinite(per_token[i, :n]).all()


def test_tokens_interact_and_the_summary_pool_reads_the_first_position():
    """Unlike a pooling head, changing one token changes the side states of the others
    (self-attention); the summary pool reads the summary position of the side stream."""
    head = randomized_ladder("summary")
    x, mask = padded_batch([6])
    changed = x.clone()
    changed[0, 4] += 5.0
    with torch.no_grad():
        before, after = head(x, mask, True), head(changed, mask, True)
        assert not torch.allclose(before[0, 0], after[0, 0])  # position 0 saw position 4
        side = head.side_stream(x, mask)
        assert torch.allclose(head(x, mask), head.classifier(side[:, 0]), atol=1e-6)


def test_blocks_and_top_layers_shape_the_ladder():
    head = build_head({"type": "ladder", "blocks": 3, "top_layers": 4}, 7, 384, 2)
    assert head.first_layer == 3 and head.down_weight.shape == (4, 384, 48)
    assert head.merge_before == [2, 3, 4] and len(head.blocks) == 3
    assert len(build_head({"type": "ladder", "blocks": 0}, 7, 384, 2).blocks) == 0
    narrow = build_head({"type": "ladder", "reduction": 64, "attention_heads": 1}, 3, 32, 2)  # one side dimension
    assert narrow.down_weight.shape == (3, 32, 1) and narrow(*padded_batch([2, 3], layers=3, hidden=32)).shape == (2, 2)
    with pytest.raises(ValueError, match="side width 48 .* not divisible by attention_heads 5"):
        build_head({"type": "ladder", "attention_heads": 5}, 7, 384, 2)


@pytest.mark.parametrize("options", [{"blocks": 0}, {"blocks": 0, "top_layers": 2}, {"blocks": 2, "top_layers": 3}])
def test_gates_shut_on_the_stream_leave_only_the_top_layer(options):
    """Each gate mixes its ladder into the stream (g * ladder + (1 - g) * stream): with every gate
    at 1 the stream is the top layer's ladder from its merge on, whatever the layers below hold."""
    head = randomized_ladder(layers=5, **options)
    with torch.no_grad():
        head.gate_logits.fill_(50.0)
        x, mask = padded_batch([3, 4], layers=5)
        lower_changed = torch.cat([torch.randn_like(x[:, :, :-1]), x[:, :, -1:]], dim=2)
        top_changed = torch.cat([x[:, :, :-1], torch.randn_like(x[:, :, -1:])], dim=2)
        torch.testing.assert_close(head(x, mask), head(lower_changed, mask))
        assert not torch.allclose(head(x, mask), head(top_changed, mask))


def test_parameters_as_reported():
    """MiniLM-L6 (7 states of 384) with the defaults: side width d = 384 / 8 = 48;
    ladders 7 * (384 * 48 + 48) = 129,360; gates 7; two side blocks of 8d^2 + 11d = 18,960
    (attention 4d^2 + 4d, feed-forward of width 2d 4d^2 + 3d, two norms 4d) = 37,920; the final
    norm 2d = 96; the output layer 48 * 2 + 2 = 98. BERT-large (25 states of 1024, d = 128):
    25 * (1024 * 128 + 128) + 25 + 2 * (8 * 128^2 + 11 * 128) + 256 + 258."""
    minilm = build_head({"type": "ladder"}, 7, 384, 2)
    assert count_parameters(minilm) == 129_360 + 7 + 37_920 + 96 + 98 == 167_481
    assert count_parameters(build_head({"type": "ladder", "pool": "attention"}, 7, 384, 2)) == 167_481 + 48
    large = build_head({"type": "ladder"}, 25, 1024, 2)
    assert count_parameters(large) == 3_280_000 + 25 + 264_960 + 256 + 258 == 3_545_499
    # the aim: at most 3% of the encoder (MiniLM-L6 22.7M, BERT-large 335M parameters)
    assert count_parameters(minilm) / 22_713_216 < 0.03 and count_parameters(large) / 335_141_888 < 0.03


def test_span_logits_mask_padding_and_padding_does_not_change_the_loss():
    head = randomized_ladder(outputs=2)
    x, mask = padded_batch([4, 6])
    y = torch.tensor([[1, 2], [0, 5]])
    wider, wider_mask = padded_batch([4, 6], extra=5, fill=7.0)
    problem = types.SimpleNamespace(device=torch.device("cpu"))
    with torch.no_grad():
        logits = span_logits(head, x, mask)
        assert logits.shape == (2, 6, 2) and (logits[0, 4:] == -1e4).all()
        assert torch.allclose(span_logits(Standardized(head, torch.zeros(4, 32), torch.ones(4, 32)), x, mask), logits)
        a = SpanProblem.loss(problem, head, (x, mask, y))
        b = SpanProblem.loss(problem, head, (wider, wider_mask, y))
    assert torch.allclose(a, b, atol=1e-5)


def test_trains_on_stored_token_features_and_reports_its_parameters(tmp_path):
    manifest = planted_token_features(tmp_path / "features")  # 4 layers of 16: the signal is one token
    heads = {"ladder": {"type": "ladder", "reduction": 2, "attention_heads": 2, "pool": "attention"}}
    train_heads(get_task("sst2"), with_training(heads, SETTINGS), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    record = json.loads((tmp_path / "heads" / "ladder" / "seed1" / "metrics.json").read_text())
    assert record["metrics"]["dev"]["accuracy"] > 0.9, record["metrics"]
    assert record["parameters"] == count_parameters(build_head(heads["ladder"], 4, 16, 2))
    assert record["parameter_percent"] == pytest.approx(100 * record["parameters"] / 10_000)


# --- init: encoder (the side network cut from the encoder's own layers) ------------------------
def test_at_full_width_each_block_attends_exactly_as_its_encoder_layer(tmp_path):
    """reduction 1 and the encoder's heads: nothing is pruned, so a side block's attention must
    compute what the encoder layer it was cut from computes (same heads, order and scale)."""
    model = load_encoder(str(make_tiny_bert(tmp_path / "bert", layers=2, hidden=32))).eval()
    with torch.no_grad():  # a fresh model's norms are all ones and zeros: any norm copied would match
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):
            norm.weight.normal_()
            norm.bias.normal_()
    head = build_head(
        {"type": "ladder", "reduction": 1, "attention_heads": 2, "blocks": 3, "init": "encoder"}, 3, 32, 2
    )
    head.init_from_encoder(encoder_layers(model))
    head.eval()
    assert head.source_layers(2) == [0, 1, 1]
    assert torch.equal(head.down_weight[1], torch.eye(32)) and not head.down_bias.any()
    y = torch.randn(2, 5, 32)
    for block, index in zip(head.blocks, head.source_layers(2)):
        layer = model.encoder.layer[index]
        with torch.no_grad():
            expected = layer.attention.output.dense(layer.attention.self(y)[0])
            side = block.self_attn(y, y, y, need_weights=False)[0]
        assert torch.allclose(side, expected, atol=1e-5)
        assert torch.equal(block.norm2.weight, layer.attention.output.LayerNorm.weight)
    assert torch.equal(head.blocks[0].norm1.weight, model.embeddings.LayerNorm.weight)
    assert torch.equal(head.blocks[0].norm1.bias, model.embeddings.LayerNorm.bias)
    assert torch.equal(head.blocks[1].norm1.weight, model.encoder.layer[0].output.LayerNorm.weight)
    assert torch.equal(head.norm.weight, model.encoder.layer[1].output.LayerNorm.weight)


def test_an_encoder_whose_embeddings_are_projected_after_their_norm_starts_layer_0s_input_norm_fresh():
    """ELECTRA-small's embeddings are normed at their own width and then projected to the hidden
    width: no norm describes the first layer's input, so a block cut from layer 0 starts with
    LayerNorm's ones and zeros (it indexed the narrower norm and failed)."""
    config = transformers.ElectraConfig(
        vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    model = transformers.ElectraModel(config).eval()
    layers = encoder_layers(model)
    assert [tuple(t.shape) for t in layers[0]["norm_in"]] == [(32,), (32,)]
    assert layers[0]["norm_in"][0].eq(1).all() and not layers[0]["norm_in"][1].any()
    assert torch.equal(layers[1]["norm_in"][0], model.encoder.layer[0].output.LayerNorm.weight)
    spec = {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 3, "init": "encoder"}
    head = build_head(spec, 3, 32, 2)
    head.init_from_encoder(layers)
    assert head.source_layers(2)[0] == 0 and head.blocks[0].norm1.weight.eq(1).all()


def test_pruned_ladders_select_one_set_of_dimensions_and_padding_still_never_matters(tmp_path):
    model = load_encoder(str(make_tiny_bert(tmp_path / "bert", layers=2, hidden=32))).eval()
    spec = {"type": "ladder", "reduction": 4, "attention_heads": 2, "init": "encoder"}
    head = build_head(spec, 3, 32, 2)
    random_start = {name: p.clone() for name, p in head.named_parameters()}
    head.init_from_encoder(encoder_layers(model))
    assert count_parameters(head) == count_parameters(build_head({**spec, "init": "random"}, 3, 32, 2))
    cut = [n for n, p in head.named_parameters() if n.startswith("blocks.") and n.endswith("weight") and p.dim() == 2]
    assert len(cut) == 8 and all(not torch.equal(head.get_parameter(n), random_start[n]) for n in cut)
    # each ladder: a selection matrix (one 1 per side dimension), the same rows for every layer
    assert torch.equal(head.down_weight.sum(dim=1), torch.ones(3, 8)) and set(head.down_weight.unique().tolist()) == {
        0.0,
        1.0,
    }
    rows = head.down_weight.argmax(dim=1)
    assert (rows == rows[0]).all() and len(set(rows[0].tolist())) == 8
    head.eval()
    x, mask = padded_batch([3, 6], layers=3, hidden=32)
    wider, wider_mask = padded_batch([3, 6], layers=3, hidden=32, extra=4, fill=5.0)
    with torch.no_grad():
        assert torch.allclose(head(x, mask), head(wider, wider_mask), atol=1e-5)
    with pytest.raises(ValueError, match="at most 2 attention_heads"):
        build_head({**spec, "attention_heads": 4, "reduction": 2}, 3, 32, 2).init_from_encoder(encoder_layers(model))


def test_trains_from_the_encoder_its_features_name_and_refuses_features_that_name_none(tmp_path):
    bert = make_tiny_bert(tmp_path / "bert", layers=3, hidden=16)
    heads = {"side": {"type": "ladder", "reduction": 2, "attention_heads": 2, "init": "encoder"}}
    manifest = planted_token_features(tmp_path / "features", encoder_dir=bert)
    train_heads(get_task("sst2"), with_training(heads, SETTINGS), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    record = json.loads((tmp_path / "heads" / "side" / "seed1" / "metrics.json").read_text())
    assert record["head_spec"]["init"] == "encoder"
    assert record["metrics"]["dev"]["accuracy"] > 0.9, record["metrics"]
    unnamed = planted_token_features(tmp_path / "old-features")
    with pytest.raises(ValueError, match="head side: init encoder needs the checkpoint's weights"):
        train_heads(
            get_task("sst2"), with_training(heads, SETTINGS), RUNTIME, unnamed, [1], tmp_path / "old-heads", threads=1
        )


# --- registry and configuration ----------------------------------------------------------------
def test_the_registry_and_the_config_take_it():
    assert HEAD_TYPES["ladder"].token_level and HEAD_TYPES["ladder"].sequence
    assert trains_on({"type": "ladder"}, "span", False) and trains_on({"type": "ladder"}, "classification", True)
    assert not trains_on({"type": "ladder"}, "regression", False)
    assert not trains_on({"type": "token-pool"}, "span", True) and trains_on({"type": "lp"}, "span", False)
    config = {"backbones": {"m": {"pretrained": "bert-base-uncased"}}, "tasks": {"mrpc": None}}
    config["heads"] = {"models": {"side": {"type": "ladder", "blocks": 1}}}
    assert validate_config(config)["heads"]["models"]["side"] == {
        "type": "ladder",
        "reduction": 8,
        "blocks": 1,
        "top_layers": 0,
        "attention_heads": 4,
        "pool": "mean",
        "dropout": 0.1,
        "init": "random",
    }


def test_span_tasks_train_the_ladder_but_not_a_pooling_token_head():
    models = {"lp": {"type": "lp"}, "side": {"type": "ladder"}, "tok": {"type": "token-pool"}}
    workflow = settings({"squad2": SHIPPED_SQUAD, "rte": None, "mrpc": {"token_features": True}}, models=models)
    assert set(workflow.task_heads("squad2")) == {"lp", "side"}
    assert set(workflow.task_heads("rte")) == {"lp"}
    assert set(workflow.task_heads("mrpc")) == {"lp", "side", "tok"}
    with pytest.raises(ConfigError, match=r"tasks\.squad2\.heads: \['tok'\] pool an example's tokens"):
        settings({"squad2": {**SHIPPED_SQUAD, "heads": ["tok"]}}, models=models)


def test_a_head_reading_mean_states_trains_on_example_tasks_only():
    models = {"lp": {"type": "lp"}, "lp-mean": {"type": "lp", "reads": "mean"}}
    workflow = settings({"squad2": SHIPPED_SQUAD, "rte": None}, models=models)
    assert set(workflow.task_heads("squad2")) == {"lp"}
    assert set(workflow.task_heads("rte")) == {"lp", "lp-mean"}
    with pytest.raises(ConfigError, match=r"tasks\.squad2\.heads: \['lp-mean'\] pool an example's tokens"):
        settings({"squad2": {**SHIPPED_SQUAD, "heads": ["lp-mean"]}}, models=models)
    with pytest.raises(ConfigError, match="reads"):
        settings({"rte": None}, models={"lp-max": {"type": "lp", "reads": "max"}})
    with pytest.raises(ConfigError, match="reads"):
        settings({"rte": {"token_features": True}}, models={"tok": {"type": "token-pool", "reads": "mean"}})


# --- mutation audit: the pruning, the pooling and the options at their edges --------------------
def synthetic_layer(hidden=16, heads=4, ff=32, seed=0) -> dict:
    """One encoder layer as ``encoder_io.encoder_layers`` gives it, with random weights."""
    g = torch.Generator().manual_seed(seed)

    def pair(rows, cols):
        return torch.randn(rows, cols, generator=g), torch.randn(rows, generator=g)

    def norm():
        return torch.randn(hidden, generator=g), torch.randn(hidden, generator=g)

    return {"q": pair(hidden, hidden), "k": pair(hidden, hidden), "v": pair(hidden, hidden),
            "out": pair(hidden, hidden), "ff_in": pair(ff, hidden), "ff_out": pair(hidden, ff),
            "norm_in": norm(), "norm_mid": norm(), "norm_out": norm(), "heads": heads}  # fmt: skip


def test_pruning_keeps_the_heaviest_dimensions_and_heads_and_rescales_the_query_for_narrower_heads():
    """Hidden 16 -> side width 4; the encoder's 4 heads of 4 dimensions -> 2 heads of 2: the kept
    residual dimensions are those of largest weight magnitude, the kept heads those of largest
    magnitude, and the query is multiplied by sqrt(2 / 4) (q.k over 2 dimensions, scaled by 1/sqrt(2))."""
    layer = synthetic_layer()
    heavy = torch.tensor([3, 7, 8, 12])
    for name in ("q", "k", "v", "ff_in"):
        layer[name][0][:, heavy] *= 10
    for name in ("out", "ff_out"):
        layer[name][0][heavy] *= 10
    layer["q"][0][8:] *= 10  # heads 2 and 3
    head = build_head(
        {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 1, "init": "encoder"}, 2, 16, 2
    )
    head.init_from_encoder([layer])
    assert torch.equal(head.down_weight[0].argmax(dim=0), heavy)
    query_rows = head.blocks[0].self_attn.in_proj_weight[:4] / 0.5**0.5
    candidates = layer["q"][0][8:][:, heavy]  # the rows of heads 2 and 3, at the kept dimensions
    for row in query_rows:
        assert torch.isclose(candidates, row, rtol=1e-5, atol=1e-5).all(dim=1).any()


def test_without_blocks_the_final_norm_starts_as_the_top_layers_output_norm():
    layers = [synthetic_layer(seed=s) for s in range(3)]
    head = build_head(
        {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 0, "init": "encoder"}, 4, 16, 2
    )
    head.init_from_encoder(layers)
    keep = head.down_weight[0].argmax(dim=0)
    assert torch.equal(head.norm.weight, layers[-1]["norm_out"][0][keep])


def test_init_encoder_refuses_side_heads_wider_than_the_encoders():
    head = build_head({"type": "ladder", "reduction": 1, "attention_heads": 2, "init": "encoder"}, 2, 16, 2)
    with pytest.raises(ValueError, match="at most 4 attention_heads of at most 4 dimensions .* got 2 of 8"):
        head.init_from_encoder([synthetic_layer()])


def test_top_layers_beyond_the_encoders_depth_use_every_layer():
    every = build_head({"type": "ladder", "reduction": 4, "top_layers": 0}, 3, 32, 2)
    beyond = build_head({"type": "ladder", "reduction": 4, "top_layers": 9}, 3, 32, 2)
    assert count_parameters(beyond) == count_parameters(every) and beyond.first_layer == 0
    assert beyond(torch.randn(2, 5, 3, 32)).shape == (2, 2)


def test_the_side_blocks_are_pre_norm():
    """LST's side blocks, and ``init: encoder``'s mapping of BERT's post-norms onto them, are
    pre-norm: each sublayer reads its norm's output and adds to the unnormed stream."""
    head = build_head({"type": "ladder", "reduction": 4, "blocks": 2}, 3, 32, 2)
    assert all(block.norm_first for block in head.blocks)


def test_per_token_outputs_go_through_the_dropout():
    head = randomized_ladder(dropout=0.5, blocks=0)
    x, mask = padded_batch([5, 3])
    with torch.no_grad():
        assert torch.equal(head(x, mask, True), head(x, mask, True))
        torch.manual_seed(1)
        assert not torch.allclose(head.train()(x, mask, True), head.eval()(x, mask, True))


def test_attention_pooling_scores_against_the_query_scaled_by_root_width():
    head = randomized_ladder("attention")
    x, mask = padded_batch([5, 3])
    with torch.no_grad():
        h = head.side_stream(x, mask)
        scores = (h @ head.query / head.width**0.5).masked_fill(~mask, float("-inf"))
        pooled = torch.einsum("bt,btd->bd", torch.softmax(scores, dim=-1), h)
        torch.testing.assert_close(head(x, mask), head.classifier(pooled))
