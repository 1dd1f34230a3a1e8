"""The verdict weighs dev's own sampling noise: a paired bootstrap over dev's rows
(``reporting.significance``), read from every run's eval predictions file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from bertvision.layout import BASELINE_PREDICTIONS, HEAD_PREDICTIONS
from bertvision.registry.metrics import spearman
from bertvision.registry.tasks import get_task
from bertvision.reporting.significance import paired_interval
from bertvision.reporting.verdict import verdict
from tests.test_reporting import mrpc


def plant(path: Path, n: int, accuracy: float, first_right: int = 0, idx=None, column="prediction") -> tuple:
    """A run's dev predictions over ``n`` rows, right on ``accuracy`` x n of them, from row
    ``first_right`` on (wrapping round), so that two runs disagree where their right rows differ;
    (the file, the column), as the summary names a run's predictions."""
    labels = np.arange(n) % 2
    right = np.zeros(n, dtype=bool)
    right[(first_right + np.arange(round(accuracy * n))) % n] = True
    frame = pd.DataFrame(
        {
            "idx": np.arange(n) if idx is None else idx,
            "label": labels,
            column: np.where(right, labels, 1 - labels),
            "split": "dev",
        }
    )
    frame.to_parquet(path)
    return str(path), column


def planted_summary(tmp_path, full: list[float], heads: list[float], rows: int) -> pd.DataFrame:
    """MRPC's summary (majority class 50%) with every run's dev predictions planted: full
    fine-tuning right on ``full``, an lp head on the untouched encoder on ``heads`` of ``rows``
    rows, the head's right rows a quarter of dev further on."""
    r = mrpc(tmp_path, full, heads, constant=0.5, checkpoint=0.0)
    for path, accuracy in zip(r.baselines, full):
        plant(path.with_name(BASELINE_PREDICTIONS), rows, accuracy)
    for path, accuracy in zip(r.heads, heads):
        plant(path.with_name(HEAD_PREDICTIONS), rows, accuracy, first_right=rows // 4)
    return r.summary()


@pytest.mark.parametrize("rows", [40, 4000])
def test_a_difference_beyond_the_seeds_spread_is_noise_when_devs_rows_cannot_tell_it(tmp_path, rows):
    """Full fine-tuning right on 80% and 82.5% of dev, heads on the untouched encoder on 70-75%:
    8.8 points apart, beyond both sides' seed spread. The head gets right some rows full
    fine-tuning gets wrong (its right rows start a quarter of dev further on): on 40 rows a redraw of dev can
    reverse the difference, on 4,000 it cannot."""
    table = planted_summary(tmp_path, [0.80, 0.825], [0.70, 0.725, 0.75], rows)
    picked = table.set_index("row").loc["BERTVision (picked)"]
    assert picked["dev_rows"] == rows and picked["score_diff_low"] < -0.0875 < picked["score_diff_high"]
    assert (picked["rival_diff_low"], picked["rival_diff_high"]) == (
        picked["score_diff_low"],
        picked["score_diff_high"],
    )
    words = verdict(table)
    if rows == 40:
        assert picked["score_diff_low"] < 0 < picked["score_diff_high"]
        assert "is within noise of it (-8.8 points, beyond the seeds' spread" in words
        assert "but a 95% paired bootstrap over dev's 40 rows gives" in words
    else:
        assert picked["score_diff_high"] < 0
        assert (
            "**full fine-tuning beats the BERTVision pick**: `lp` on the 0-epoch checkpoint trails it by 8.8 points"
            in words
        )
        assert "on dev (beyond the seeds' spread" in words
        assert "; a 95% paired bootstrap over dev's 4000 rows gives -" in words


@pytest.mark.parametrize("rows", [40, 4000])
def test_a_score_past_the_fixed_bar_is_learning_only_beyond_devs_noise(tmp_path, rows):
    """Every model 4 to 6 points above the majority class (50%), past the fixed 2-point bar (the
    best of many candidates clears it by chance on a few hundred rows: random STS-B labels got a
    winner): on 40 dev rows a redraw of dev brings the pick's and its rival's scores down to the
    majority class's, so no model learned the task; on 4,000 rows it cannot."""
    table = planted_summary(tmp_path, [0.55, 0.56], [0.54, 0.55, 0.56], rows)
    words = verdict(table)
    if rows == 40:
        assert (table["score_low"].dropna() < 0.5).all() and table["score_low"].notna().sum() == 2
        assert (
            "**no model learned this task**: neither the pick nor the best method on the selection split beats "
            "predicting the same class every time (0.5) beyond dev's sampling noise (a 95% bootstrap over dev's 40 "
            "rows of each one's score reaches down to 0."
        ) in words
    else:
        assert (table["score_low"].dropna() > 0.5).all()
        assert "no model learned" not in words


def test_the_interval_is_exact_where_every_draw_gives_the_same_difference(tmp_path):
    mrpc_task = get_task("mrpc")
    always = plant(tmp_path / "always.parquet", 50, 1.0)
    never = plant(tmp_path / "never.parquet", 50, 0.0)
    assert paired_interval(mrpc_task, [always], [never]) == (1.0, 1.0, 50)
    assert paired_interval(mrpc_task, [always, never], [never]) == (0.5, 0.5, 50)  # each side: its runs' mean
    same = plant(tmp_path / "same.parquet", 50, 0.6)
    assert paired_interval(mrpc_task, [same], [same]) == (0.0, 0.0, 50)
    ensemble = plant(tmp_path / "ensemble.parquet", 50, 1.0, column="prediction_mean")  # a head + BERT's column
    assert paired_interval(mrpc_task, [ensemble], [never]) == (1.0, 1.0, 50)


def test_no_interval_where_a_side_kept_no_predictions_or_other_rows(tmp_path):
    mrpc_task = get_task("mrpc")
    a = plant(tmp_path / "a.parquet", 50, 0.8)
    assert paired_interval(mrpc_task, [a], [None]) is None  # a head + BERT ensemble keeps none
    assert paired_interval(mrpc_task, [a], [float("nan")]) is None  # as a frame of runs holds its None
    assert paired_interval(mrpc_task, [a], [(str(tmp_path / "missing.parquet"), "prediction")]) is None
    assert paired_interval(mrpc_task, [a], [(a[0], "prediction_mean")]) is None  # no ensemble kept there
    shifted = plant(tmp_path / "shifted.parquet", 50, 0.8, idx=np.arange(1, 51))
    assert paired_interval(mrpc_task, [a], [shifted]) is None
    old = tmp_path / "old.parquet"  # written before predictions carried their rows' ids and labels
    pd.DataFrame({"split": ["dev"] * 2, "prediction": [0, 1]}).to_parquet(old)
    assert paired_interval(mrpc_task, [a], [(str(old), "prediction")]) is None
    assert paired_interval(get_task("squad2"), [a], [a]) is None  # spans: scored by the SQuAD decoding


def test_a_regression_interval_follows_its_pearson(tmp_path):
    rng = np.random.default_rng(0)
    gold = rng.normal(size=300)
    for name, noise in (("close", 0.3), ("far", 1.5)):
        pd.DataFrame(
            {"idx": np.arange(300), "label": gold, "prediction": gold + noise * rng.normal(size=300), "split": "dev"}
        ).to_parquet(tmp_path / f"{name}.parquet")
    close, far = (str(tmp_path / "close.parquet"), "prediction"), (str(tmp_path / "far.parquet"), "prediction")
    low, high, rows = paired_interval(get_task("stsb"), [close], [far])
    assert rows == 300 and 0 < low < high


def test_spearman_ranks_ties_as_scipy_does():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 6, 500).astype(float)
    b = a + rng.normal(size=500)
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert spearman(np.array([1.0, 2.0, 2.0, 3.0]), np.array([4.0, 3.0, 3.0, 1.0])) == pytest.approx(-1.0)


def test_an_answerability_task_gets_no_interval_over_its_windows(tmp_path):
    """Its rows are context windows, while its score is per question (the best window's label): a
    bootstrap over windows would measure another quantity, so none is drawn."""
    task = get_task("squad2-answerable")
    idx = np.repeat(np.arange(40), 3)
    labels = np.tile([0, 1, 1], 40)
    files = []
    for name, predictions in (("a", np.tile([0, 1, 1], 40)), ("b", np.zeros(120, dtype=int))):
        frame = pd.DataFrame({"idx": idx, "label": labels, "split": task.eval_splits[0], "prediction": predictions})
        frame.to_parquet(tmp_path / f"{name}.parquet")
        files.append([(tmp_path / f"{name}.parquet", "prediction")])
    assert paired_interval(task, *files) is None


def test_the_interval_is_the_binomials_where_the_sides_differ_on_some_rows(tmp_path):
    """Right on every row against right on all but 20 of 200 (the last 20 among them): a draw's
    difference is its share of those rows, Binomial(200, 0.1) / 200, whose 95% interval is 0.06 to
    0.14. An 80% interval (0.075 to 0.125), or draws that never reach the last row, passed every test."""
    from scipy import stats

    mrpc_task = get_task("mrpc")
    always = plant(tmp_path / "always.parquet", 200, 1.0)
    most = plant(tmp_path / "most.parquet", 200, 0.9)  # right on rows 0 to 179: the last 20 are wrong
    low, high, rows = paired_interval(mrpc_task, [always], [most])
    want_low, want_high = (stats.binom(200, 0.1).ppf(q) / 200 for q in (0.025, 0.975))
    assert rows == 200 and abs(low - want_low) <= 0.01 and abs(high - want_high) <= 0.01
    right, last_wrong = plant(tmp_path / "right.parquet", 50, 1.0), plant(tmp_path / "last.parquet", 50, 0.98)
    assert paired_interval(mrpc_task, [right], [last_wrong])[1] > 0  # wrong on the last row alone: draws reach it
