"""Degenerate-run flags come from the predictions and the scores."""

import pandas as pd

from bertvision.evaluation.flags import metric_flag, prediction_flags
from bertvision.registry.tasks import get_task


def write(tmp_path, predictions, split="dev"):
    path = tmp_path / "eval_predictions.parquet"
    pd.DataFrame({"split": split, "prediction": predictions}).to_parquet(path)
    return path


def test_a_constant_classifier_is_flagged_and_a_varied_one_is_not(tmp_path):
    assert prediction_flags(write(tmp_path, [1, 1, 1]), get_task("cola")) == {"dev": "predicts only class 1"}
    assert prediction_flags(write(tmp_path, [1, 0, 1]), get_task("cola")) == {}


def test_constant_regression_and_an_always_abstaining_reader(tmp_path):
    assert prediction_flags(write(tmp_path, [2.5, 2.5]), get_task("stsb")) == {"dev": "constant output"}
    assert prediction_flags(write(tmp_path, [2.5, 2.6]), get_task("stsb")) == {}
    assert prediction_flags(write(tmp_path, [2.5, 2.51]), get_task("stsb")) == {}  # small, but not constant
    assert prediction_flags(write(tmp_path, ["", ""]), get_task("squad2")) == {"dev": "abstains on every question"}
    assert prediction_flags(write(tmp_path, ["", "Paris"]), get_task("squad2")) == {}


def test_only_the_evaluation_splits_count(tmp_path):
    assert prediction_flags(write(tmp_path, [0, 0], split="selection"), get_task("cola")) == {}


def test_chance_level_scores():
    cola, stsb = get_task("cola"), get_task("stsb")
    assert metric_flag(cola, "mcc", 0.004) == "mcc ≈ 0"
    assert metric_flag(cola, "mcc", 0.3) is None
    assert metric_flag(cola, "accuracy", 0.0) is None
    assert metric_flag(stsb, "spearman", -0.01) == "spearman ≈ 0"
