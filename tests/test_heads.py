"""Head parameter counts, shapes and gradients."""

import inspect

import pytest
import torch

from bertvision.config.schema import validate_config
from bertvision.models.heads import AdapterPoolerHead, LayerMeanHead, ScalarMixHead, build_head, count_parameters
from bertvision.registry.heads import HEAD_CLASSES, HEAD_TYPES

L, H, C = 7, 384, 2


def adapter(layers, hidden, outputs, **options) -> AdapterPoolerHead:
    head = build_head({"type": "adapter", **options}, layers, hidden, outputs)
    assert isinstance(head, AdapterPoolerHead)
    return head


def test_scalar_mix_parameter_count_and_gradients():
    head = build_head({"type": "lp"}, L, H, C)
    assert isinstance(head, ScalarMixHead) and count_parameters(head) == L + 1 + H * C + C
    assert isinstance(head.layer_logits, torch.nn.Parameter) and isinstance(head.gamma, torch.nn.Parameter)
    x = torch.randn(4, L, H)
    # Make layers distinguishable so the mixing weights matter.
    x[:, 0] *= 5
    head(x).sum().backward()
    assert head.layer_logits.grad is not None and head.layer_logits.grad.abs().sum() > 0
    assert head.gamma.grad is not None and head.gamma.grad.abs() > 0


def test_scalar_mix_softmax_is_over_weights_not_data():
    head = build_head({"type": "lp"}, L, H, C)
    with torch.no_grad():
        head.layer_logits.copy_(torch.tensor([10.0] + [-10.0] * (L - 1)))
    x = torch.randn(3, L, H)
    mixed = head.gamma * torch.einsum("l,blh->bh", head.layer_weights(), x)
    assert torch.allclose(mixed, x[:, 0], atol=1e-6)
    assert torch.allclose(head.layer_weights().sum(), torch.tensor(1.0))


def test_layer_mean_parameter_count():
    head = build_head({"type": "mean"}, L, H, C)
    assert isinstance(head, LayerMeanHead) and count_parameters(head) == H * C + C


def test_the_layer_mean_head_is_its_linear_layer_on_the_mean_over_every_layer():
    head = build_head({"type": "mean"}, 3, 8, 2).eval()
    x = torch.randn(4, 3, 8)
    torch.testing.assert_close(head(x), head.classifier(x.mean(dim=1)))


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("skip", [False, True])
def test_adapter_parameter_counts(width, skip):
    shared = adapter(L, H, C, width=width, shared=True, skip=skip)
    independent = adapter(L, H, C, width=width, shared=False, skip=skip)
    classifier = (L * width + (H if skip else 0)) * C + C
    assert count_parameters(shared) == H * width + width + classifier
    assert count_parameters(independent) == L * (H * width + width) + classifier


def test_adapter_matches_original_paper_size():
    # BERT-large, adapter 386 shared: 395,650 adapter parameters (reference §2.3).
    head = adapter(25, 1024, 2, width=386, shared=True)
    assert count_parameters(head.adapter) == 395_650


def test_independent_adapter_uses_one_projection_per_layer():
    """With every projection but layer 0's zero, only layer 0's states reach the output."""
    head = adapter(3, 8, 2, width=4, shared=False).eval()
    with torch.no_grad():
        head.weight[1:] = 0.0
        head.bias[1:] = 0.0
        x = torch.randn(5, 3, 8)
        other_layers = torch.cat([x[:, :1], torch.randn(5, 2, 8)], dim=1)
        assert torch.equal(head(x), head(other_layers))
        assert not torch.allclose(head(x), head(torch.cat([torch.randn(5, 1, 8), x[:, 1:]], dim=1)))


def test_independent_adapter_starts_as_one_nn_linear_per_layer_would():
    """Each layer's projection is drawn as ``nn.Linear(hidden, width)`` draws its own: uniform
    within +-1/sqrt(hidden), weight and bias alike."""
    torch.manual_seed(0)
    head = adapter(3, 64, 2, width=256, shared=False)
    bound = 64**-0.5
    for values in (head.weight, head.bias):
        assert values.abs().max() <= bound and values.abs().max() > 0.95 * bound


PER_EXAMPLE_WITH_DROPOUT = [
    name for name, t in HEAD_TYPES.items() if "dropout" in t.options and not t.token_level and not t.sequence
]


@pytest.mark.parametrize("name", PER_EXAMPLE_WITH_DROPOUT)
def test_a_heads_dropout_is_live_in_training_and_off_in_evaluation(name):
    torch.manual_seed(0)
    head = build_head({"type": name, "dropout": 0.5}, 3, 64, 2)
    with torch.no_grad():
        for parameter in head.parameters():  # the cosine head's output layer starts at zero
            parameter.normal_()
        x = torch.randn(16, 3, 64)
        assert not torch.allclose(head.train()(x), head(x))
        assert torch.equal(head.eval()(x), head(x))


def test_skip_concatenates_last_layer():
    head = adapter(3, 8, 1, width=4, skip=True)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        head.classifier.weight.zero_()
        head.classifier.weight[0, -8:] = 1.0
        head.classifier.bias.zero_()
    assert torch.allclose(head(x)[:, 0], x[:, -1].sum(dim=1), atol=1e-5)


def test_build_head_registry():
    assert isinstance(build_head({"type": "lp"}, L, H, C), ScalarMixHead)
    assert build_head({"type": "adapter", "width": 16}, L, H, 1)(torch.randn(2, L, H)).shape == (2, 1)
    with pytest.raises(KeyError, match="unknown head type"):
        build_head({"type": "capsule"}, L, H, C)
    with pytest.raises(ValueError, match=r"head type 'lp' has no option\(s\) \['width'\]"):
        build_head({"type": "lp", "width": 3}, L, H, C)


def test_an_integer_option_written_as_a_whole_float_builds_as_an_integer():
    """JSON Schema counts 64.0 an integer, so the config passes it; the head took the float and a
    tensor's size refused it in the job (a search's choices: [64.0] alike)."""
    validate_config({"backbones": {"m": {"pretrained": "x"}}, "tasks": {"mrpc": None},
                     "heads": {"models": {"w": {"type": "adapter", "width": 64.0}}}})  # fmt: skip
    head = build_head({"type": "adapter", "width": 64.0, "dropout": 0}, L, H, C)
    assert head.adapter.out_features == 64 and count_parameters(head) == H * 64 + 64 + L * 64 * C + C


@pytest.mark.parametrize("name", list(HEAD_TYPES))
def test_registered_options_are_the_constructor_arguments(name):
    """A head class takes (layers, hidden, outputs) and exactly its registered options, keyword
    only and without defaults: the registry (and the schema made from it) owns the defaults."""
    head_type = HEAD_TYPES[name]
    params = inspect.signature(HEAD_CLASSES[name]).parameters
    assert list(params)[:3] == ["layers", "hidden", "outputs"]
    options = {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(options) == set(head_type.options) and len(params) == 3 + len(options)
    assert all(p.default is p.empty for p in options.values())


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "lp"},
        {"type": "mean"},
        {"type": "adapter", "width": 8, "skip": True},
        {"type": "adapter", "width": 8, "shared": False},
    ],
)
def test_heads_apply_per_token(spec):
    """The same head on (batch, tokens, layers, hidden) equals it applied to each token alone."""
    head = build_head(spec, 3, 16, 2).eval()
    x = torch.randn(2, 5, 3, 16)
    per_token = torch.stack([torch.stack([head(x[b, t][None])[0] for t in range(5)]) for b in range(2)])
    assert head(x).shape == (2, 5, 2)
    assert torch.allclose(head(x), per_token, atol=1e-5)


def test_every_registered_head_type_is_built_by_one_class():
    from bertvision.registry.heads import builds

    assert set(HEAD_CLASSES) == set(HEAD_TYPES)
    assert HEAD_CLASSES["lp"] is ScalarMixHead
    with pytest.raises(KeyError, match="unknown head type 'nope'"):
        builds("nope")(ScalarMixHead)
    with pytest.raises(ValueError, match="built by both ScalarMixHead and LayerMeanHead"):
        builds("lp")(LayerMeanHead)


def test_a_search_draws_only_the_options_a_head_type_marks_searchable(monkeypatch):
    """A head type with an option of another type's searchable name, not searchable in its own:
    the search drew it for it all the same (the rule asked only whether the type had the name)."""
    from bertvision.registry.heads import HEAD_TYPES, HeadType, Option, searched_parameters

    fixed = HeadType("fixed-reduction", "a reduction it does not search", {"reduction": Option(int, 8, "fixed")})
    monkeypatch.setitem(HEAD_TYPES, fixed.name, fixed)
    space = {"reduction": {"choices": [4, 8]}, "learning_rate": {"low": 1e-4, "high": 1e-2}}
    assert searched_parameters(space, "fixed-reduction") == ["learning_rate"]
    assert searched_parameters(space, "ladder") == ["reduction", "learning_rate"]


def test_a_constant_feature_is_standardized_to_finite_values():
    """A dimension the train split never varies (std 0: one training example, or a constant state)
    is divided by a floor, not by zero: the head still answers with finite numbers."""
    from bertvision.models.heads import standardized

    x = torch.randn(6, 3, 8)
    x[:, :, 0] = 2.5
    mean, std = x.mean(0), x.std(0)
    assert (std[:, 0] == 0).all()
    head = standardized(build_head({"type": "lp"}, 3, 8, 2), (mean, std)).eval()
    assert torch.isfinite(head(x)).all() and torch.isfinite(head(x + 1)).all()


def test_the_registry_types_options_and_knows_which_heads_read_a_pair_apart():
    """A whole float is an integer option's integer, any other float stays as given (to be refused,
    not cut to an integer); a head that reads a pair apart only takes no ``pair`` option, and
    trains on no span task, which has no apart states."""
    from bertvision.registry.heads import complete_spec, trains_on

    width = HEAD_TYPES["adapter"].options["width"]
    assert width.typed(64.0) == 64 and isinstance(width.typed(64.0), int) and width.typed(64.5) == 64.5
    with pytest.raises(ValueError, match=r"head type 'cosine' has no option\(s\) \['pair'\]"):
        complete_spec({"type": "cosine", "pair": "joint"})
    assert trains_on({"type": "cosine"}, "regression", False, apart=True)
    assert not trains_on({"type": "cosine"}, "span", True, apart=True)
    assert not trains_on({"type": "lp", "pair": "apart"}, "span", True, apart=True)
