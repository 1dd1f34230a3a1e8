"""Head + BERT ensembles: stored logits round-trip, and the max / mean combinations."""

import numpy as np
import pytest

from bertvision.evaluation.ensemble import (
    combine,
    ensemble_examples,
    ensemble_windows,
    load_logits,
    save_logits,
    softmax,
)


def test_logits_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    windows = [rng.normal(size=(n, 2)) for n in (5, 9, 3)]
    examples = rng.normal(size=(4, 3))
    save_logits(tmp_path / "l.npz", {"dev": windows, "selection": examples})
    back = load_logits(tmp_path / "l.npz")
    assert all(np.array_equal(a, b) for a, b in zip(windows, back["dev"]))
    assert np.array_equal(np.concatenate(back["selection"]), examples)


def test_a_split_with_no_rows_round_trips_as_no_rows(tmp_path):
    # an extraction shard past the end of a split smaller than the shard count keeps no rows of it
    save_logits(tmp_path / "l.npz", {"selection": [], "dev": np.zeros((2, 3))})
    back = load_logits(tmp_path / "l.npz")
    assert back["selection"] == [] and len(back["dev"]) == 2


def test_mean_of_identical_models_is_the_model_and_max_dominates():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    same = np.exp(combine(a, a, "mean", axis=-1))
    assert np.allclose(same, softmax(a, -1), atol=1e-9)
    maxed = np.exp(combine(a, b, "max", axis=-1))
    assert (maxed >= softmax(a, -1) - 1e-9).all() and (maxed >= softmax(b, -1) - 1e-9).all()
    mean = np.exp(combine(a, b, "mean", axis=-1))
    assert np.allclose(mean, (softmax(a, -1) + softmax(b, -1)) / 2)


def test_window_ensembles_normalise_over_positions_per_column():
    rng = np.random.default_rng(2)
    head, bert = [rng.normal(size=(7, 2))], [rng.normal(size=(7, 2))]
    out = ensemble_windows(head, bert, "mean")[0]
    assert np.allclose(np.exp(out).sum(axis=0), 1.0)  # start and end each a distribution over tokens
    with pytest.raises(ValueError, match="different windows"):
        ensemble_windows(head, [rng.normal(size=(6, 2))], "max")


def test_regression_ensemble_averages_predictions():
    assert np.allclose(
        ensemble_examples(np.array([[1.0], [3.0]]), np.array([[3.0], [5.0]]), "mean", "regression"), [[2.0], [4.0]]
    )


def test_a_task_of_three_classes_keeps_both_ensembles_and_one_of_two_the_mean():
    """With two classes the max and the mean of two softmaxes pick the same class; with three they need not."""
    from bertvision.evaluation.ensemble import ensemble_rules
    from bertvision.registry.tasks import get_task

    assert ensemble_rules(get_task("mnli")) == ("max", "mean")
    assert ensemble_rules(get_task("mrpc")) == ensemble_rules(get_task("stsb")) == ("mean",)
