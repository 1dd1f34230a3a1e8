"""Gen-1's convolutional heads (``cnn``, ``xception``): the original's parameter counts and
lengths, shapes per example and per token, BatchNorm in training and evaluation, the
too-short-width error, the config schema, and learning a planted signal through the real
head-training stage (saved with its BatchNorm statistics and loaded back)."""

import json
import types

import numpy as np
import pandas as pd
import pytest
import torch

from bertvision.config.schema import validate_config
from bertvision.errors import ConfigError
from bertvision.features.store import FeatureSet
from bertvision.models.cnn_heads import ConvHead, XceptionHead
from bertvision.models.head_io import load_head
from bertvision.models.heads import build_head, count_parameters
from bertvision.registry.heads import XCEPTION_MIN_WIDTH
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
from bertvision.training.span import SpanProblem
from tests.stages import with_training
from tests.test_train_head import RUNTIME, SETTINGS, planted_features


def bn_statistics(module: torch.nn.Module) -> int:
    """BatchNorm running means and variances: what Keras counts as non-trainable parameters."""
    return sum(b.numel() for name, b in module.named_buffers() if name.endswith(("running_mean", "running_var")))


def test_xception_matches_the_original_counts_and_lengths():
    """Original-system.md §2.7: input (1, 1024, 26), Dense(2); 1024 -> 341 -> 339 -> 170."""
    head = build_head({"type": "xception"}, 26, 1024, 2)
    assert isinstance(head, XceptionHead)
    assert count_parameters(head) == 264_066
    assert count_parameters(head) + bn_statistics(head) == 267_010
    assert not any(c.bias is not None for c in head.modules() if isinstance(c, torch.nn.Conv1d))
    cls = build_head({"type": "xception", "cls_residual": True}, 26, 1024, 2)
    assert count_parameters(cls) + bn_statistics(cls) == 269_058
    assert count_parameters(cls) == 266_114  # docs/heads.md: trainable with cls_residual
    lengths = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: lengths.append(o.shape[-1]))
        for m in (head.entry[0], head.entry[3], head.residual, head.main)
    ]
    head.eval()(torch.randn(2, 26, 1024))
    for hook in hooks:
        hook.remove()
    assert lengths == [341, 339, 170, 170]


@pytest.mark.parametrize("pool, adapter", [("none", 0), ("lp", 0), ("mean", 0), ("none", 8), ("lp", 8)])
@pytest.mark.parametrize("kernel, channels, dilation", [(3, 16, 1), (4, 5, 3)])
def test_cnn_parameter_count(pool, adapter, kernel, channels, dilation):
    L, H, C = 7, 40, 3
    head = build_head(
        {
            "type": "cnn",
            "pool": pool,
            "adapter_width": adapter,
            "kernel": kernel,
            "channels": channels,
            "dilation": dilation,
        },
        L,
        H,
        C,
    )
    assert isinstance(head, ConvHead)
    inputs, width = (L if pool == "none" else 1), (adapter or H)
    front = (L + 1 if pool == "lp" else 0) + (H * adapter + adapter)
    assert count_parameters(head) == front + inputs * kernel * channels + channels + channels * width * C + C
    assert head(torch.randn(5, L, H)).shape == (5, C)  # 'same' padding keeps the width, even kernels too
    assert head.conv.dilation == (dilation,)


@pytest.mark.parametrize("head_type", ["cnn", "xception"])
def test_the_layer_pools_read_every_layer_and_lps_scale_multiplies_the_mix(head_type):
    """``pool: mean`` and ``lp`` at its even start see the layers' mean: the layers in another order
    give the same output; ``lp``'s scale multiplies the mix before the adapter."""
    torch.manual_seed(0)
    L, H = 4, 64
    x = torch.randn(6, L, H)
    shuffled = x.roll(1, dims=1)  # every layer moved
    for pool in ("mean", "lp"):
        head = build_head({"type": head_type, "pool": pool, "adapter_width": 16}, L, H, 2).eval()
        with torch.no_grad():
            torch.testing.assert_close(head(x), head(shuffled))
            assert not torch.allclose(head(x), head(x * torch.linspace(0.2, 1.8, L)[:, None]))
    head = build_head({"type": head_type, "pool": "lp", "adapter_width": 16}, L, H, 2).eval()
    with torch.no_grad():
        unscaled = head(2 * x)
        head.front.gamma.fill_(2.0)
        torch.testing.assert_close(head(x), unscaled)


@pytest.mark.parametrize("adapter", [0, 1, 8])
def test_the_cnn_is_its_convolution_through_a_relu_on_the_gelu_adapted_front(adapter):
    """cnn: Linear(flatten(ReLU(Conv1d(front)))), the front's adapter (any width A > 0, 1 too) a
    GELU(W x + b) on the hidden axis."""
    torch.manual_seed(0)
    head = build_head({"type": "cnn", "pool": "mean", "adapter_width": adapter}, 3, 16, 2).eval()
    x = torch.randn(5, 3, 16)
    with torch.no_grad():
        front = x.mean(dim=1, keepdim=True)
        if adapter:
            front = torch.nn.functional.gelu(front @ head.front.adapter.weight.T + head.front.adapter.bias)
        want = head.classifier(torch.relu(head.conv(front)).flatten(1))
        torch.testing.assert_close(head(x), want)


def test_xception_pools_globally_by_the_mean_and_its_avgpool_leaves_the_padding_out():
    """Global average pooling of residual + main; the main branch's AvgPool(3, stride 2, 'same')
    averages only the real positions (Keras' 'same' pooling): a constant stays that constant at the
    edges."""
    torch.manual_seed(0)
    head = build_head({"type": "xception"}, 3, 64, 2).eval()
    x, branches = torch.randn(4, 3, 64), {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: branches.__setitem__(n, o))
             for n, m in (("residual", head.residual), ("main", head.main))]  # fmt: skip
    with torch.no_grad():
        out = head(x)
        for hook in hooks:
            hook.remove()
        torch.testing.assert_close(out, head.classifier((branches["residual"] + branches["main"]).mean(dim=-1)))
        torch.testing.assert_close(head.main[-1](torch.full((1, 2, 7), 3.0)), torch.full((1, 2, 4), 3.0))


def test_xceptions_cls_residual_appends_the_last_layers_state():
    head = build_head({"type": "xception", "cls_residual": True}, 4, 64, 1).eval()
    x = torch.randn(3, 4, 64)
    with torch.no_grad():
        head.classifier.weight.zero_()
        head.classifier.weight[0, -64:] = 1.0
        head.classifier.bias.zero_()
        torch.testing.assert_close(head(x)[:, 0], x[:, -1].sum(dim=1))


def test_cnn_default_size_on_minilm():
    assert count_parameters(build_head({"type": "cnn"}, 7, 384, 2)) == 12_642  # the docstring's example


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "cnn"},
        {"type": "cnn", "pool": "lp", "kernel": 5, "dropout": 0.5},
        {"type": "cnn", "pool": "mean", "adapter_width": 16, "dilation": 2},
        {"type": "xception"},
        {"type": "xception", "cls_residual": True, "dropout": 0.3},
        {"type": "xception", "pool": "lp", "adapter_width": 20},
        {"type": "xception", "pool": "mean"},
    ],
)
def test_shapes_per_example_and_per_token(spec):
    L, H, C = 4, 32, 2
    head = build_head(spec, L, H, C).eval()
    assert head(torch.randn(6, L, H)).shape == (6, C)
    tokens = torch.randn(2, 5, L, H)
    out = head(tokens)
    assert out.shape == (2, 5, C)
    assert torch.allclose(out[1, 3], head(tokens[1, 3][None])[0], atol=1e-5)


def trained_a_little(head: torch.nn.Module, L: int, H: int) -> torch.nn.Module:
    """A few training-mode passes, so that BatchNorm's running statistics are not the initial ones."""
    head.train()
    with torch.no_grad():
        for _ in range(5):
            head(torch.randn(16, L, H) * 3 + 1)
    return head.eval()


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "xception", "dropout": 0.5},
        {"type": "cnn", "dropout": 0.5},
        {"type": "xception", "pool": "lp", "adapter_width": 16, "cls_residual": True},
    ],
)
def test_eval_outputs_are_deterministic_and_independent_of_the_batch(spec):
    L, H = 5, 24
    torch.manual_seed(0)
    head = trained_a_little(build_head(spec, L, H, 2), L, H)
    x = torch.randn(9, L, H)
    with torch.no_grad():
        together = head(x)
        assert torch.equal(together, head(x))
        alone = torch.cat([head(x[i : i + 1]) for i in range(len(x))])
        perm = torch.randperm(len(x))
        shuffled = head(x[perm])[torch.argsort(perm)]
        with_others = head(torch.cat([x, torch.randn(7, L, H) * 10]))[: len(x)]
    for other in (alone, shuffled, with_others):
        assert torch.allclose(together, other, atol=1e-5)


def test_training_mode_uses_batch_statistics():
    """In training mode BatchNorm normalizes with the batch's own statistics (and updates the
    running ones): one row's output depends on the rest of the batch."""
    L, H = 5, 24
    torch.manual_seed(0)
    head = build_head({"type": "xception"}, L, H, 2).train()
    x = torch.randn(8, L, H)
    before = head.entry[1].running_mean.clone()
    with torch.no_grad():
        a = head(x)[0]
        b = head(torch.cat([x[:1], torch.randn(7, L, H) * 10]))[0]
    assert not torch.allclose(a, b, atol=1e-3)
    assert not torch.equal(before, head.entry[1].running_mean)


def test_xception_trains_on_a_batch_of_one_at_its_minimum_width():
    head = build_head({"type": "xception"}, 3, XCEPTION_MIN_WIDTH, 2).train()
    head(torch.randn(1, 3, XCEPTION_MIN_WIDTH)).sum().backward()
    head = build_head({"type": "xception", "adapter_width": XCEPTION_MIN_WIDTH}, 3, 64, 2).train()
    head(torch.randn(1, 3, 64)).sum().backward()


@pytest.mark.parametrize(
    "spec, hidden, message",
    [
        ({"type": "xception"}, 14, "got hidden size 14"),
        ({"type": "xception", "adapter_width": 8}, 384, "got adapter_width 8"),
    ],
)
def test_too_short_a_width_is_a_clear_error(spec, hidden, message):
    with pytest.raises(ValueError, match=rf"xception head: .* at least {XCEPTION_MIN_WIDTH} .*{message}"):
        build_head(spec, 3, hidden, 2)


def test_span_training_keeps_padding_out_of_batch_statistics():
    """SpanProblem.loss runs the head on real tokens only: extra padding changes nothing, even for
    a head whose BatchNorm normalizes with the batch's statistics."""
    torch.manual_seed(0)
    head = build_head({"type": "xception"}, 3, 16, 2).train()
    x, y = torch.randn(2, 6, 3, 16), torch.tensor([[1, 2], [0, 4]])
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    x[0, 4:] = 0.0
    padded = torch.cat([x, torch.zeros(2, 5, 3, 16)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], dim=1)
    problem = types.SimpleNamespace(device=torch.device("cpu"))
    with torch.no_grad():
        a = SpanProblem.loss(problem, head, (x, mask, y))
        b = SpanProblem.loss(problem, head, (padded, padded_mask, y))
    assert torch.allclose(a, b, atol=1e-6)


def test_the_config_accepts_the_heads_and_rejects_unknown_options():
    config = {
        "backbones": {"m": {"pretrained": "bert-base-uncased"}},
        "tasks": {"mrpc": None},
        "heads": {"models": {"xception": {"type": "xception"}, "cnn-lp": {"type": "cnn", "pool": "lp", "kernel": 5}}},
    }
    models = validate_config(config)["heads"]["models"]
    assert models["xception"] == {
        "type": "xception",
        "cls_residual": False,
        "pool": "none",
        "adapter_width": 0,
        "dropout": 0.0,
        "reads": "cls",
        "pair": "joint",
    }
    assert models["cnn-lp"] == {
        "type": "cnn",
        "kernel": 5,
        "channels": 16,
        "dilation": 1,
        "pool": "lp",
        "adapter_width": 0,
        "dropout": 0.1,
        "reads": "cls",
        "pair": "joint",
    }
    bad = [
        ({"type": "cnn", "kernal": 5}, r"heads.models.x: 'kernal' is not a key here: did you mean 'kernel'\?"),
        ({"type": "xception", "pool": "max"}, r"heads.models.x.pool: 'max' is not one of \['none', 'lp', 'mean'\]"),
        ({"type": "cnn", "channels": 0}, r"heads.models.x.channels: 0 is less than the minimum of 1"),
    ]
    for spec, message in bad:
        config = {
            "backbones": {"m": {"pretrained": "bert-base-uncased"}},
            "tasks": {"mrpc": None},
            "heads": {"models": {"x": spec}},
        }
        with pytest.raises(ConfigError, match=message):
            validate_config(config, source="x.yaml")


HEADS = {
    "cnn": {"type": "cnn"},
    "cnn-lp": {"type": "cnn", "pool": "lp", "kernel": 5},
    "cnn-adapter": {"type": "cnn", "adapter_width": 16, "dilation": 2},
    "xception": {"type": "xception"},
    "xception-lp": {"type": "xception", "pool": "lp", "dropout": 0.2},
    "xception-cls": {"type": "xception", "cls_residual": True},
    "xception-adapter": {"type": "xception", "adapter_width": 16},
}


def test_the_heads_learn_the_planted_signal_and_load_back_with_their_statistics(tmp_path):
    """Through the real train_heads stage: 400 training rows in batches of 19, so every epoch
    ends on a batch of one example."""
    manifest = planted_features(tmp_path / "features")
    settings = SETTINGS.replace(batch_size=19)
    assert 400 % settings.batch_size == 1
    train_heads(get_task("sst2"), with_training(HEADS, settings), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    layers, hidden = 4, 16
    x, _, idx = FeatureSet.open(manifest, "dev").read_all()
    for name, spec in HEADS.items():
        run = tmp_path / "heads" / name / "seed1"
        record = json.loads((run / "metrics.json").read_text())
        # A layer mix in front of the Xception finds the informative layer slowly (0.8 here, 0.93 in 30 epochs).
        floor = 0.75 if name == "xception-lp" else 0.9
        assert record["metrics"]["dev"]["accuracy"] > floor, (name, record["metrics"])
        head = load_head(run, layers, hidden, 2)
        assert not head.training and record["parameters"] == count_parameters(build_head(spec, layers, hidden, 2))
        assert record["pair"] is None  # a single-text task: no pair form to read
        if spec["type"] == "xception":
            bn = head.head.entry[1]
            assert int(bn.num_batches_tracked) > 0 and not torch.allclose(
                bn.running_var, torch.ones_like(bn.running_var)
            )
        # The loaded head (in eval mode, with the saved running statistics) reproduces the dev predictions.
        dev = pd.read_parquet(run / "eval_predictions.parquet").query("split == 'dev'")
        assert (idx == dev["idx"].to_numpy()).all()
        with torch.no_grad():
            out = head(torch.from_numpy(x.astype(np.float32))).numpy()
        assert np.allclose(out, np.stack(dev["outputs"].to_numpy()), atol=1e-4), name


# --- the 2-D CNN over each example's tokens x hidden image (cnn2d) ---------------------------------


def test_the_2d_cnn_never_sees_padding_and_counts_its_parameters():
    from bertvision.models.heads import build_head, count_parameters

    torch.manual_seed(0)
    head = build_head({"type": "cnn2d", "kernel": 3, "channels": 4, "adapter_width": 8}, 5, 16, 3).eval()
    assert count_parameters(head) == (16 * 8 + 8) + (5 * 9 * 4 + 4) + (4 * 9 * 4 + 4) + (4 * 3 + 3)
    x = torch.randn(2, 6, 5, 16)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    padded = x.clone()
    padded[1, 3:] = float("inf")  # whatever padding holds
    with torch.no_grad():
        out = head(padded, mask)
        alone = head(x[1:, :3], mask[1:, :3])
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    assert torch.allclose(out[1], alone[0], atol=1e-5)
    with pytest.raises(ValueError, match="needs token_features"):
        head(torch.randn(2, 5, 16))


def test_the_2d_cnn_finds_a_signal_at_any_token(tmp_path):
    """The planted task of the token-level heads: one token somewhere carries the label."""
    import json

    from bertvision.registry.tasks import get_task
    from bertvision.stages.train_heads import train_heads
    from tests.stages import with_training
    from tests.test_token_head import RUNTIME, SETTINGS, planted_token_features

    manifest = planted_token_features(tmp_path / "features")
    heads = {"image": {"type": "cnn2d", "channels": 16, "adapter_width": 0, "dropout": 0.0}}
    train_heads(get_task("sst2"), with_training(heads, SETTINGS), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    record = json.loads((tmp_path / "heads" / "image" / "seed1" / "metrics.json").read_text())
    assert record["metrics"]["dev"]["accuracy"] > 0.9, record["metrics"]
