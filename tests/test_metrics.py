"""Our metrics agree with scikit-learn and SciPy."""

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from bertvision.registry.metrics import accuracy, f1, mcc, pearson, spearman


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    pred = np.where(rng.random(300) < 0.7, gold, 1 - gold)
    assert accuracy(pred, gold) == pytest.approx(skm.accuracy_score(gold, pred))
    assert f1(pred, gold) == pytest.approx(skm.f1_score(gold, pred))
    assert mcc(pred, gold) == pytest.approx(skm.matthews_corrcoef(gold, pred))


def test_f1_is_not_accuracy():
    gold = np.array([1, 1, 0, 0, 0, 0])
    pred = np.array([1, 0, 0, 0, 0, 0])
    assert f1(pred, gold) == pytest.approx(2 / 3)
    assert accuracy(pred, gold) == pytest.approx(5 / 6)


def test_multiclass_mcc_and_constant_predictor():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 200)
    pred = np.where(rng.random(200) < 0.5, gold, rng.integers(0, 3, 200))
    assert mcc(pred, gold) == pytest.approx(skm.matthews_corrcoef(gold, pred))
    assert mcc(np.zeros(10, int), np.r_[np.zeros(5, int), np.ones(5, int)]) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, 200), 1)  # ties, as in STS-B
    pred = gold + rng.normal(0, 1, 200)
    assert pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold)[0])
    assert spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold)[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_macro_f1_matches_sklearn_over_the_classes_of_gold_and_predictions(seed):
    """Equal weights (not support), and a class predicted but absent from gold counts (its F1 0):
    both mutants of f1_macro passed every test."""
    from bertvision.registry.metrics import f1_macro

    rng = np.random.default_rng(seed)
    gold = rng.choice([0, 1, 2], size=60, p=[0.7, 0.2, 0.1])
    pred = rng.choice([0, 1, 2, 3], size=60)  # class 3 never in gold
    want = skm.f1_score(gold, pred, average="macro", labels=np.union1d(gold, pred), zero_division=0)
    assert f1_macro(pred, gold) == pytest.approx(want)
    assert f1_macro(pred, gold) != pytest.approx(skm.f1_score(gold, pred, average="weighted", zero_division=0))


def test_a_chance_flag_is_for_scores_near_zero_not_for_negative_ones():
    from bertvision.evaluation.flags import metric_flag
    from bertvision.registry.tasks import get_task

    cola = get_task("cola")
    assert metric_flag(cola, "mcc", 0.01) == metric_flag(cola, "mcc", -0.01) == "mcc ≈ 0"
    assert metric_flag(cola, "mcc", -0.3) is None and metric_flag(cola, "mcc", 0.3) is None
