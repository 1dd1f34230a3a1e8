"""What the tables and the summary's plain words claim, from records written as the stages
write them: mean ± std wherever seeds exist (scores and seconds), no winner named where no model
learned the task, "within noise" where the seeds cannot tell the difference, and the answerable
questions that no window wholly holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertvision.layout import BERT_PREDICTIONS, HEAD_PREDICTIONS
from bertvision.registry.tasks import get_task
from bertvision.reporting.candidates import FULL_FT, candidate_runs
from bertvision.reporting.choice import choose_picks
from bertvision.reporting.costs import cost_markdown, cost_table
from bertvision.reporting.experiments import search_markdown, search_table
from bertvision.reporting.markdown import write_csv
from bertvision.reporting.results import long_records, result_tables
from bertvision.reporting.summary import summary_table
from bertvision.reporting.summary_page import summary_markdown
from bertvision.reporting.verdict import verdict


class Records:
    """Metrics files of one backbone ("tiny") and fine-tuning seed 1 under ``root``."""

    def __init__(self, root: Path):
        self.root, self.bert, self.heads, self.baselines = root, [], [], []

    def _write(self, path: Path, record: dict, predictions: str | None = None) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        if predictions:  # the degenerate-run flags read them
            pd.DataFrame({"split": ["dev", "dev"], "prediction": [0, 1]}).to_parquet(path.with_name(predictions))
        return path

    def bert_at(self, task, checkpoint, dev, seconds, extra=None, selection=None):
        record = {
            "model": "tiny",
            "task": task,
            "seed": 1,
            "checkpoint": checkpoint,
            "metrics": {"selection": {"x": 0}, "dev": {**dev, **(extra or {})}},
            "train_seconds": seconds,
            "encoder_parameters": 1000,
            "device": "cpu",
        }
        record["metrics"]["selection"] = dict(selection or record["metrics"]["dev"])
        self.bert.append(
            self._write(self.root / f"bert/{task}/{checkpoint}/eval_metrics.json", record, BERT_PREDICTIONS)
        )

    def head(self, task, checkpoint, name, seed, dev, seconds, selection=None, extra=None, race=None):
        record = {
            "race": race,
            "task": task,
            "source": {"model": "tiny", "ft_seed": 1, "checkpoint": checkpoint},
            "head": name,
            "seed": seed,
            "metrics": {"selection": selection or dev, "dev": {**dev, **(extra or {})}},
            "parameters": 10,
            "parameter_percent": 1.0,
            "encoder_parameters": 1000,
            "seconds": seconds,
            "device": "cpu",
            "features_stored": False,
            "ensembles": {},
        }
        path = self.root / f"heads/{task}/{checkpoint}/{name}/seed{seed}/metrics.json"
        self.heads.append(self._write(path, record, HEAD_PREDICTIONS))

    def baseline(self, task, seed, dev, seconds, extra=None):
        record = {
            "model": "tiny",
            "task": task,
            "seed": seed,
            "metrics": {"selection": dev, "dev": {**dev, **(extra or {})}},
            "encoder_parameters": 1000,
            "train_seconds": seconds,
            "device": "cpu",
            "best_epoch": 1,
            "epochs": 2,
        }
        self.baselines.append(self._write(self.root / f"baselines/{task}/seed{seed}/metrics.json", record))

    def summary(self) -> pd.DataFrame:
        runs = candidate_runs(self.baselines, self.bert, self.heads, [], [])
        return summary_table(runs, choose_picks(runs))


def mrpc(root, full: list[float], heads: list[float], constant=0.684, checkpoint=1.0) -> Records:
    """MRPC with full fine-tuning over ``full`` (one seed each) and an lp head over ``heads`` (head
    seeds of fine-tuning seed 1's checkpoint ``checkpoint``; 0: the untouched encoder's)."""
    r = Records(root)
    extra = {"constant_score": constant}
    for seed, acc in enumerate(full, 1):
        r.baseline("mrpc", seed, {"accuracy": acc, "f1": acc}, 60.0, extra)
    r.bert_at("mrpc", 0.0, {"accuracy": 0.5, "f1": 0.5}, 0.0, extra)
    r.bert_at("mrpc", 1.0, {"accuracy": 0.7, "f1": 0.7}, 20.0, extra)
    for seed, acc in enumerate(heads, 1):
        r.head("mrpc", checkpoint, "lp", seed, {"accuracy": acc, "f1": acc}, 8.0 + 2 * seed, extra=extra)
    return r


def test_no_winner_is_named_where_every_model_is_at_the_all_abstain_score(tmp_path):
    """The default run's SQuAD slice: 52% unanswerable, every model abstains (F1 ≈ 52), and full
    fine-tuning ran one seed; the old words said the head "beats full fine-tuning by 1.2 points"."""
    r = Records(tmp_path)
    dev = {"constant_score": 52.0}
    r.baseline("squad2", 1, {"f1": 50.17}, 61.1, dev)
    r.bert_at("squad2", 0.0, {"f1": 50.0}, 0.0, dev)
    r.bert_at("squad2", 1.0, {"f1": 52.0}, 21.8, dev)
    for seed, f1 in enumerate([51.0, 51.5, 51.64], 1):
        r.head("squad2", 0.0, "lp", seed, {"f1": f1}, 12.0, extra=dev)
    table = r.summary()
    assert (table["constant_score"] == 52.0).all()
    words = verdict(table)
    assert "**no model learned this task**" in words and "no winner" in words
    assert "beats full fine-tuning" not in words and "within noise" not in words
    md = summary_markdown(table)
    assert "abstaining on every question scores 52.00 f1" in md
    # one model clear of the bar (by more than 2 points) and the task is learned
    r.bert_at("squad2", 0.3, {"f1": 54.5}, 7.0, dev)
    assert "no model learned" not in verdict(r.summary())


def test_a_classification_task_at_the_majority_class_names_no_winner(tmp_path):
    table = mrpc(tmp_path, [0.69], [0.684, 0.68, 0.70]).summary()  # BERT at 1 epoch: 0.70 ≤ 0.684 + 0.02
    assert "**no model learned this task**: no model tried (every head, checkpoint and seed" in verdict(table)
    assert "beats predicting the same class every time by more than 0.02 accuracy" in verdict(table)
    assert "predicting the same class every time scores 0.684" in summary_markdown(table)


def test_dev_rows_that_repeat_a_train_row_are_said_in_their_tasks_block(tmp_path):
    """The download's record of the rows (layout.rows_record): repeats of a train row's texts are
    a note of the task they belong to; none, and nothing is said."""
    table = pd.concat([mrpc(tmp_path / "a", [0.8], [0.8]).summary(), stsb_like(tmp_path / "b")])
    rows = {"mrpc": {"task": "mrpc", "rows": {"train": 300, "selection": 50, "dev": 400},
                     "repeated": {"selection": 0, "dev": 6}},
            "stsb": {"task": "stsb", "rows": {"train": 300, "selection": 50, "dev": 400},
                     "repeated": {"selection": 0, "dev": 0}}}  # fmt: skip
    md = summary_markdown(table, rows_records=rows)
    mrpc_block, stsb_block = md.split("\n## mrpc")[1].split("\n## stsb")
    note = "6 of 400 dev rows repeat a train row's text exactly; a model that remembers train scores well on them"
    assert f"{note} (dev is scored as given)." in mrpc_block
    assert "repeat a train row" not in stsb_block and "repeat a train row" not in summary_markdown(table)


def test_a_share_of_rows_drawn_from_a_split_is_said_with_the_splits_size(tmp_path):
    table = pd.concat([mrpc(tmp_path / "a", [0.8], [0.8]).summary(), stsb_like(tmp_path / "b")])
    rows = {"mrpc": {"task": "mrpc", "rows": {"train": 450, "selection": 50, "dev": 408}, "repeated": {},
                     "drawn": {"train": {"rows": 500, "of": 3668}, "dev": {"rows": 408, "of": 408}}},
            "stsb": {"task": "stsb", "rows": {"train": 300, "selection": 50, "dev": 400}, "repeated": {},
                     "drawn": {"train": {"rows": 350, "of": 350}, "dev": {"rows": 400, "of": 1500}}}}  # fmt: skip
    mrpc_block, stsb_block = summary_markdown(table, rows_records=rows).split("\n## mrpc")[1].split("\n## stsb")
    assert "Drawn with data.seed: 500 of the 3,668 train rows (before the selection split)." in mrpc_block
    assert "Drawn with data.seed: 400 of the 1,500 dev rows." in stsb_block


def stsb_like(root) -> pd.DataFrame:
    r = Records(root)
    r.baseline("stsb", 1, {"pearson": 0.8, "spearmanr": 0.8}, 20.0)
    r.bert_at("stsb", 1.0, {"pearson": 0.7, "spearmanr": 0.7}, 20.0)
    r.head("stsb", 1.0, "lp", 1, {"pearson": 0.75, "spearmanr": 0.75}, 8.0)
    return r.summary()


def test_one_seed_of_full_fine_tuning_leaves_any_difference_undetermined(tmp_path):
    words = verdict(mrpc(tmp_path, [0.80], [0.75, 0.76, 0.77]).summary())
    assert "is undetermined against it (-4.0 points; full fine-tuning ran one seed" in words
    assert "trails" not in words and "within noise" not in words


def test_a_side_whose_seeds_score_the_same_measures_no_spread(tmp_path):
    words = verdict(mrpc(tmp_path, [0.80, 0.80], [0.70, 0.71, 0.72]).summary())
    assert "is undetermined against it (-9.0 points; full fine-tuning scored the same" in words


def test_one_fine_tuning_seed_behind_a_fine_tuned_path_leaves_it_undetermined(tmp_path):
    """Three head seeds on one fine-tuning run measure the heads' noise, not the fine-tuning's."""
    r = mrpc(tmp_path, [0.80, 0.82], [0.70, 0.71, 0.72])
    table = r.summary()
    assert table.set_index("row").loc["BERTVision (picked)", "ft_seeds"] == 1
    words = verdict(table)
    assert "is undetermined against it" in words and "fine-tuned with one seed" in words


def test_overlapping_seed_ranges_are_noise_and_separate_ones_are_not(tmp_path):
    """Heads on the untouched encoder: their seeds are the path's whole spread."""
    words = verdict(mrpc(tmp_path / "a", [0.80, 0.82], [0.79, 0.80, 0.81], checkpoint=0.0).summary())
    assert "within noise" in words and "the two mean ± std ranges overlap" in words
    words = verdict(mrpc(tmp_path / "b", [0.80, 0.82], [0.70, 0.71, 0.72], checkpoint=0.0).summary())
    assert words.startswith(
        "**full fine-tuning beats the BERTVision pick**: `lp` on the 0-epoch checkpoint trails it by 10.0"
    )
    assert "points on dev (beyond the seeds' spread" in words
    # full fine-tuning is the rival: where the pick stands against it is said once
    assert "Against full fine-tuning" not in words
    assert "The pick trains 1% of the encoder's parameters at 0.20× full fine-tuning's own seconds" in words
    words = verdict(mrpc(tmp_path / "c", [0.70, 0.71], [0.80, 0.81, 0.82], checkpoint=0.0).summary())
    assert "against the best other method, full fine-tuning, it is ahead of it by 10.5 points on dev" in words


def test_seconds_are_mean_and_std_over_seeds_in_the_summary_and_the_cost_table(tmp_path):
    r = mrpc(tmp_path, [0.80, 0.82], [0.79, 0.80, 0.81])
    table = r.summary()
    picked = table.set_index("row").loc["BERTVision (picked)"]
    # a head's path: fine-tuning to its checkpoint (20 s) + its own seconds 10, 12, 14
    assert picked["seconds"] == pytest.approx(32.0) and picked["seconds_std"] == pytest.approx(2.0)
    assert "| 32.0 ± 2.0 |" in summary_markdown(table)
    costs = cost_table(r.bert, r.heads, [], [])
    row = costs.iloc[0]
    assert row["n"] == 3 and row["score_std"] == pytest.approx(0.01)
    assert row["head_s_std"] == pytest.approx(2.0) and row["bertvision_s_std"] == pytest.approx(2.0)
    md = cost_markdown(costs)
    assert "| 1 | lp | 3 | 0.800 ± 0.010 |" in md and "| 12.0 ± 2.0 | 32.0 ± 2.0 |" in md


def test_answerable_questions_without_a_whole_answer_window_are_reported(tmp_path):
    r = Records(tmp_path)
    counts = {"constant_score": 0.52, "questions": 100, "answerable_no_window": 3}
    dev = {"accuracy": 0.6, "f1": 0.6, "accuracy_any_no": 0.55, "f1_any_no": 0.5}
    r.baseline("squad2-answerable", 1, dev, 20.0, counts)
    r.bert_at("squad2-answerable", 0.0, dev, 0.0, counts)
    r.bert_at("squad2-answerable", 1.0, dev, 20.0, counts)
    r.head("squad2-answerable", 1.0, "lp", 1, dev, 5.0, extra=counts)
    md = summary_markdown(r.summary())
    assert "3 answerable dev questions have no window that holds the whole answer" in md
    summary, squad_md = result_tables(long_records(r.bert, r.heads), ["lp"])["squad"]
    assert "3 of the 100 questions are answerable but no window holds the whole answer" in squad_md
    assert set(summary["answerable_no_window"]) == {3}
    glue, _ = result_tables(long_records(mrpc(tmp_path / "glue", [0.8], [0.8]).bert, []), ["lp"])["glue"]
    assert "answerable_no_window" not in glue.columns  # the counts are answerability's
    table = r.summary().assign(answerable_no_window=0)
    assert "Every answerable dev question has a window that holds its whole answer." in summary_markdown(table)


def test_search_table_gives_mean_and_std_over_the_fine_tuning_seeds_studies(tmp_path):
    paths = []
    for seed, value in ((1, 0.80), (2, 0.82)):
        path = tmp_path / f"ft{seed}" / "best.json"
        path.parent.mkdir()
        keys = {"model": "tiny", "task": "stsb", "ftseed": seed, "checkpoint": "1", "head": "adapter8"}
        record = {
            "keys": keys,
            "trials": {"COMPLETE": 3, "PRUNED": 1, "FAIL": 0},
            "space": {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}},
            "best_params": {"learning_rate": 0.002 * seed},
            "best_value": value,
            "study": f"s{seed}",
        }
        path.write_text(json.dumps(record))
        paths.append(path)
    table = search_table(paths)
    assert list(table["ft_seed"]) == [1, 2]
    md = search_markdown(table)
    assert "| tiny | stsb | 1 | adapter8 | 2 | 6 | 2 | 0 |" in md
    assert "ft1: learning_rate=0.002 / ft2: learning_rate=0.004" in md and "| 0.8100 ± 0.0141 |" in md


def candidate(kind: str, model: str, ft_seed: int, selection: float, fraction: float = 1.0, **extra) -> dict:
    """One candidate row (``reporting.candidates``) of MRPC on the tiny backbone."""
    return {
        "backbone": "tiny", "task": "mrpc", "kind": kind, "checkpoint": fraction, "model": model,
        "ft_seed": ft_seed, "selection": selection, "dev": 0.7, "trainable_params": 10, "encoder_params": 1000,
        "seconds": 1.0, "whole_seconds": float("nan"), "feature_bytes": 0.0, "device": "cpu", "precision": "fp32",
        "finetune_s": 0.0, "extract_s": 0.0, "head_s": 1.0, "search_s": 0.0, "finetune_jobs_s": 0.0,
        "extract_jobs_s": 0.0, "heads_job_s": 1.0, "race_s": 0.0, **extra,
    }  # fmt: skip


def test_the_pick_is_a_record_made_where_the_choice_is_made_with_the_seed_to_serve(tmp_path):
    """The pick (lp + BERT at 1 epoch, best mean selection) names its head, its ensemble rule and
    the fine-tuning seed whose run of the ensemble scored best on selection (1: 0.81, though lp
    alone scored best on seed 2); picks.json holds the same, and the summary's picked row is the
    pick's."""
    from bertvision.layout import Checkpoint
    from bertvision.reporting.picks import Pick, read_picks, write_picks
    from bertvision.reporting.summary import ROW_KINDS

    lp = [(1, 0.70), (1, 0.71), (2, 0.72), (2, 0.60)]
    rows = [candidate("head", "lp", ft, s, head="lp", ensemble=None) for ft, s in lp]
    # the ensemble served is what picks the seed: seed 1's best ensemble run, though seed 2's lp alone is best
    mean = [(1, 0.81), (1, 0.79), (2, 0.80), (2, 0.80)]
    rows += [candidate("ensemble", "lp + BERT (mean)", ft, s, head="lp", ensemble="mean") for ft, s in mean]
    rows += [candidate("head", "ap", 1, 0.75, fraction=0.0, head="ap", ensemble=None)]
    runs = pd.DataFrame(rows)
    picks = choose_picks(runs)
    want = Pick("tiny", "mrpc", Checkpoint(1), "lp + BERT (mean)", "lp", "mean", 1, picks[0].selection_mean, 0.7)
    assert picks == [want] and picks[0].selection_mean == pytest.approx(0.8)
    write_picks(picks, tmp_path / "picks.json")
    assert read_picks(tmp_path / "picks.json") == picks
    assert json.loads((tmp_path / "picks.json").read_text())["picks"][0]["checkpoint"] == "1"
    picked = summary_table(runs, picks).set_index("row").loc[ROW_KINDS[2]]
    assert (picked["model"], picked["checkpoint"]) == ("lp + BERT (mean)", 1.0)
    # the summary renders whatever the pick record says, and chooses nothing itself
    other = Pick("tiny", "mrpc", Checkpoint(0), "ap", "ap", None, 1, 0.75, 0.7)
    picked = summary_table(runs, [other]).set_index("row").loc[ROW_KINDS[2]]
    assert (picked["model"], picked["checkpoint"]) == ("ap", 0.0)


def test_a_later_checkpoint_is_picked_only_for_a_gain_its_seeds_can_tell_from_noise():
    """lp at 1 epoch has the best mean selection score; adapter at 0.3 trails it by 0.01, less
    than the standard error of their difference (0.0206, from adapter's 0.02 and lp's 0.005): the
    pick is adapter at 0.3, the earliest checkpoint within noise (0 trails by 0.11). A gain of 0.07
    is beyond noise: lp at 1. The error said is the difference's, not lp's with itself (0.0071)."""
    from bertvision.layout import Checkpoint

    def runs(lp_scores):
        rows = [
            candidate("head", "adapter", ft, s, fraction=0.3, head="adapter", ensemble=None)
            for ft, s in [(1, 0.79), (2, 0.83)]
        ]
        rows += [
            candidate("head", "lp", ft, s, fraction=1.0, head="lp", ensemble=None) for ft, s in zip((1, 2), lp_scores)
        ]
        rows += [
            candidate("head", "ap", ft, s, fraction=0.0, head="ap", ensemble=None) for ft, s in [(1, 0.70), (2, 0.70)]
        ]
        return pd.DataFrame(rows)

    [within] = choose_picks(runs([0.815, 0.825]))
    assert (within.model, within.checkpoint) == ("adapter", Checkpoint(0.3))
    md = summary_markdown(summary_table(runs([0.815, 0.825]), [within]))
    assert "`lp` on the 1-epoch checkpoint scored +0.0100 above the pick on selection, within the standard " in md
    assert "error of the difference (0.0206)" in md
    [beyond] = choose_picks(runs([0.87, 0.89]))
    assert (beyond.model, beyond.checkpoint) == ("lp", Checkpoint(1))
    assert "above the pick on selection" not in summary_markdown(summary_table(runs([0.87, 0.89]), [beyond]))


def test_the_untouched_encoders_heads_repeated_under_each_fine_tuning_seed_count_once_in_the_noise():
    """ap on checkpoint 0 (0.80 and 0.84 over two head seeds) is in each fine-tuning seed's runs:
    counted once, its standard error is 0.02 and lp's gain at 1 epoch (+0.02) is within noise, so
    ap is the pick; counted twice, the error shrank to 0.015 and lp was picked for a gain the
    runs cannot tell from noise."""
    from bertvision.layout import Checkpoint

    rows = [
        candidate("head", "ap", ft, s, fraction=0.0, head="ap", ensemble=None, seed=head_seed, repeat=ft == 2)
        for ft in (1, 2)
        for head_seed, s in ((1, 0.80), (2, 0.84))
    ]
    rows += [candidate("head", "lp", ft, s, head="lp", ensemble=None, repeat=False) for ft, s in ((1, 0.83), (2, 0.85))]
    runs = pd.DataFrame(rows)
    [picked] = choose_picks(runs)
    assert (picked.model, picked.checkpoint) == ("ap", Checkpoint(0))
    frozen = summary_table(runs, [picked]).set_index("row").loc["frozen encoder (best head)"]
    assert frozen["n"] == 2


def test_the_frozen_row_is_a_head_and_each_rows_difference_is_in_full_fine_tunings_std():
    """The frozen encoder's row is its best head, not a head + BERT ensemble at checkpoint 0 that
    scores higher on selection; a row's difference from full fine-tuning in std units divides by
    full fine-tuning's std over its seeds (0.0283), not the row's own (0: undefined)."""
    rows = [candidate(FULL_FT, "BERT", ft, 0.7, fraction=np.nan, dev=d) for ft, d in ((1, 0.70), (2, 0.74))]
    rows += [candidate("head", "ap", 1, 0.8, fraction=0.0, head="ap", ensemble=None, seed=s, dev=0.8) for s in (1, 2)]
    rows += [
        candidate("ensemble", "ap + BERT (mean)", 1, 0.9, fraction=0.0, head="ap", ensemble="mean", seed=s, dev=0.6)
        for s in (1, 2)
    ]
    runs = pd.DataFrame(rows)
    frozen = summary_table(runs, choose_picks(runs)).set_index("row").loc["frozen encoder (best head)"]
    assert frozen["model"] == "ap"
    assert frozen["score_diff_std_units"] == pytest.approx((0.80 - 0.72) / np.std([0.70, 0.74], ddof=1))


def test_a_head_and_bert_ensemble_counts_the_heads_and_the_fine_tuned_encoders_parameters():
    """In the race's and the bundles' ranking: ap + BERT ties lp on selection, and lp's 100
    trainable parameters are fewer than ap's 10 with the encoder's 1,000, so lp ranks first."""
    from bertvision.reporting.ranking import best, head_candidates

    def record(head, parameters, selection, ensembles=None):
        return {"head": head, "parameters": parameters, "encoder_parameters": 1000,
                "metrics": {"selection": {"accuracy": selection}}, "ensembles": ensembles or {}}  # fmt: skip

    records = [record("ap", 10, 0.5, {"mean": {"selection": {"accuracy": 0.9}}}), record("lp", 100, 0.9)]
    candidates = {c.name: c.parameters for c in head_candidates(get_task("sst2"), records)}
    assert candidates == {"ap": 10, "ap + BERT (mean)": 1010, "lp": 100}
    assert best(head_candidates(get_task("sst2"), records)).name == "lp"


def test_a_missing_selection_score_never_picks_the_seed_to_serve():
    from bertvision.layout import Checkpoint
    from bertvision.reporting.choice import served_seed

    runs = pd.DataFrame([candidate("head", "lp", 1, float("nan")), candidate("head", "lp", 2, 0.5)])
    assert served_seed(runs, "head", "lp", Checkpoint(1)) == 2
    tied = pd.DataFrame([candidate("head", "lp", 2, 0.5), candidate("head", "lp", 1, 0.5)])
    assert served_seed(tied, "head", "lp", Checkpoint(1)) == 1


def test_a_candidate_missing_a_runs_selection_score_is_no_candidate_as_in_the_race():
    """The race counts a missing selection score as missing for the whole candidate; so does the pick."""
    runs = pd.DataFrame(
        [candidate("head", "a", 1, 0.90, head="a", ensemble=None), candidate("head", "a", 2, float("nan"), head="a")]
        + [candidate("head", "b", seed, 0.80, head="b", ensemble=None) for seed in (1, 2)]
    )
    [made] = choose_picks(runs)
    assert made.model == "b"


def test_the_summary_says_how_the_heads_were_chosen_and_never_picks_a_raced_out_head(tmp_path):
    """A head its job's race stopped has the best selection score here, yet the pick is the
    survivor; the summary says racing ran and how many runs it stopped."""
    r = mrpc(tmp_path, [0.80, 0.82], [0.70, 0.71, 0.72], checkpoint=0.0)
    assert "Head selection: grid" in summary_markdown(r.summary())
    race = {"protocol": "racing", "rungs": [2], "keep": 0.5}
    for path in r.heads:  # the lp runs survived the race
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "race": {**race, "raced_out_at_epoch": None}}))
    dev = {"accuracy": 0.9, "f1": 0.9}
    r.head("mrpc", 0.0, "ap", 1, dev, 5.0, extra={"constant_score": 0.684}, race={**race, "raced_out_at_epoch": 2})
    table = r.summary()
    assert table.set_index("row").loc["BERTVision (picked)", "model"] == "lp"
    assert "Head selection: racing (successive halving on the selection split): 1 of 4 head runs" in summary_markdown(
        table
    )


def test_a_model_that_learned_counts_though_the_summary_does_not_show_it(tmp_path):
    """Every row shown sits at the majority class, but a head the selection split did not prefer
    learned the task: the verdict looks at every candidate, not only the rows shown."""
    r = mrpc(tmp_path, [0.69], [0.684, 0.68, 0.70])
    assert "no model learned" in verdict(r.summary())
    for seed in (1, 2, 3):
        r.head("mrpc", 1.0, "ap", seed, {"accuracy": 0.80, "f1": 0.80}, 9.0, selection={"accuracy": 0.5, "f1": 0.5},
               extra={"constant_score": 0.684})  # fmt: skip
    table = r.summary()
    assert "ap" not in set(table["model"]) and "no model learned" not in verdict(table)


def test_the_learning_bar_is_a_share_of_the_metrics_range():
    """MCC and correlations run from -1 to 1: their bar is twice accuracy's 0.02; SQuAD's F1 (0..100): 2."""
    from bertvision.registry.tasks import get_task
    from bertvision.reporting.verdict import learning_bar

    assert learning_bar(get_task("mrpc")) == pytest.approx(0.02)
    assert learning_bar(get_task("cola")) == pytest.approx(0.04)
    assert learning_bar(get_task("stsb")) == pytest.approx(0.04)
    assert learning_bar(get_task("squad2")) == pytest.approx(2.0)


def test_a_finished_run_prints_each_tasks_verdict_in_one_sentence_from_the_summary_it_made(tmp_path, capsys):
    """The headline: the verdict's first sentence without Markdown, from the summary's CSV as the
    tables stage writes it; nothing from a summary older than the run (another run's settings)."""
    import time

    from bertvision.reporting.headline import print_headline

    table = mrpc(tmp_path, [0.80, 0.82], [0.70, 0.71, 0.72], checkpoint=0.0).summary()
    csv = tmp_path / "summary.csv"
    table.to_csv(csv, index=False)
    print_headline(csv, "results/tables/summary.md", since=time.time() - 60)
    out = capsys.readouterr().out
    [line] = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert line.startswith("mrpc (tiny): full fine-tuning beats the BERTVision pick: lp on the 0-epoch checkpoint ")
    assert line.endswith(".") and "**" not in line and "`" not in line and "Against full fine-tuning" not in line
    assert "results/tables/summary.md" in out
    print_headline(csv, "results/tables/summary.md", since=time.time() + 60)
    assert capsys.readouterr().out == ""


def test_a_download_from_before_the_rows_record_still_makes_the_tables(tmp_path, caplog):
    """A run whose data/raw folders predate rows.json: the tables are made, the missing record is
    named in the job's log, and only the note of repeats is left out."""
    from bertvision.stages.tables import build_tables

    raw = tmp_path / "raw" / "mrpc"
    raw.mkdir(parents=True)
    caplog.set_level("WARNING", logger="bertvision.stages.tables")
    build_tables([], [], [], [], 1, [], tmp_path / "tables", raw_dirs=[raw])
    assert (tmp_path / "tables" / "summary.md").exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"{raw / 'rows.json'}: not there (downloaded before the record was kept); its repeats of train go unsaid"
    ]


def test_a_tie_on_selection_goes_to_fewer_parameters_in_the_verdict_as_in_the_pick():
    """The verdict's "best on the selection split" follows the ranking's tie rule (fewer trainable
    parameters), not a strict comparison that hands a tie to the rival."""
    from bertvision.reporting.summary import ROW_KINDS, SUMMARY_COLUMNS

    def row(kind, **values):
        base = dict.fromkeys(SUMMARY_COLUMNS, float("nan"))
        base.update(backbone="tiny", task="mrpc", row=kind, metric="accuracy", n=3, ft_seeds=3, dev_std=0.01,
                    parameter_percent=1.0, seconds=10.0, seconds_std=1.0, whole_seconds=100.0, whole_seconds_std=1.0,
                    feature_bytes=0.0, cost_ratio=0.5, whole_cost_ratio=0.5, constant_score=0.68,
                    deterministic=False, best_dev_any=0.9, passed_over=None, device="cpu",
                    precision="fp32")  # fmt: skip
        return {**base, **values}

    full = row(ROW_KINDS[0], model="BERT, epoch kept of 3: 3, 3, 3", dev_mean=0.80, selection_mean=0.85,
               trainable_params=110_000_000)  # fmt: skip
    picked = row(ROW_KINDS[2], model="lp", checkpoint=1.0, dev_mean=0.86, selection_mean=0.85, trainable_params=1538)
    text = verdict(pd.DataFrame([full, picked], columns=SUMMARY_COLUMNS))
    assert text.startswith("**The BERTVision pick is the best method on the selection split**"), text


def test_a_run_the_race_stopped_is_marked_in_the_methods_table_and_never_on_its_front():
    """Its score and seconds are cut short: it sat on the front unmarked (the default's SST-2: ap, lp and
    adapter64-skip at 0, stopped at epoch 2 or 6)."""
    from bertvision.reporting.methods import method_table, methods_markdown

    rows = [candidate("head", "ap", 1, 0.8, head="ap", ensemble=None, raced_out=True, dev=0.9, head_s=0.1)]
    rows += [candidate("head", "lp", seed, 0.8, head="lp", ensemble=None, raced_out=False) for seed in (1, 2)]
    rows += [candidate("full fine-tuning", "BERT", seed, 0.8, whole_seconds=300.0) for seed in (1, 2)]
    table = method_table(pd.DataFrame(rows))
    by_model = table.set_index("model")
    assert by_model.loc["ap", "stopped"] == 1 and not by_model.loc["ap", "on_front"]
    assert by_model.loc["lp", "stopped"] == 0 and by_model.loc["lp", "on_front"]  # ap no longer beats it
    assert "| ap @ 1 (stopped by the race: 1 of 1) |" in methods_markdown(table)


def test_a_candidate_whose_jobs_time_is_unknown_costs_unknown_in_the_methods_table_not_0():
    """A fine-tuning job whose time was not found leaves the path's cost unknown (never 0 s), and a
    path of unknown cost is not on the cost-score front, where it would push off what it cannot beat."""
    from bertvision.reporting.methods import method_table

    rows = [candidate("head", "lp", seed, 0.8, head="lp", ensemble=None, finetune_jobs_s=np.nan) for seed in (1, 2)]
    rows += [candidate("full fine-tuning", "BERT", seed, 0.8, whole_seconds=300.0) for seed in (1, 2)]
    table = method_table(pd.DataFrame(rows)).set_index("model")
    assert np.isnan(table.loc["lp", "cost_seconds"]) and not table.loc["lp", "on_front"]
    assert table.loc["BERT", "cost_seconds"] == 300.0 and table.loc["BERT", "on_front"]


def test_a_run_the_race_stopped_is_flagged_in_the_results_and_left_out_of_the_plots(tmp_path):
    """A head stopped early by its job's race (one seed, cut short) is in glue.md's mean with its
    flag, counted in ``stopped``; the plots leave its rows out (a stopped head drew a line falling
    with fine-tuning)."""
    from bertvision.reporting.plots import primary_rows
    from bertvision.reporting.results import long_records, summarize

    r = mrpc(tmp_path, [0.80, 0.82], [0.70, 0.71, 0.72], checkpoint=0.0)
    race = {"protocol": "racing", "rungs": [2], "keep": 0.5}
    dev = {"accuracy": 0.6, "f1": 0.6}
    r.head("mrpc", 0.0, "ap", 1, dev, 5.0, extra={"constant_score": 0.684}, race={**race, "raced_out_at_epoch": 2})
    glue = summarize(long_records(r.bert, r.heads), ["lp", "ap"])
    rows = glue[(glue["split"] == "dev") & (glue["metric"] == "accuracy")].set_index("model")
    assert rows.loc["ap", "stopped"] == 1 and "stopped by the race at epoch 2" in rows.loc["ap", "flags"]
    assert rows.loc["lp", "stopped"] == 0
    plotted = set(primary_rows(glue, "mrpc")["model"])
    assert "lp" in plotted and "ap" not in plotted


def test_the_summary_page_in_html_keeps_angle_brackets_as_text_and_tables_as_tables():
    """The summary names config keys such as heads.models.<head>.pair: as raw HTML a browser would hide them."""
    from bertvision.reporting.markdown import markdown_page

    page = markdown_page("The heads read heads.models.<head>.pair.\n\n| a | b |\n|---|---|\n| 1 | <2> |\n", "s")
    assert "heads.models.&lt;head&gt;.pair" in page and "<td>&lt;2&gt;</td>" in page and page.count("<table>") == 1


def test_checkpoint_zeros_transfer_to_itself_counts_once_though_every_fine_tuning_seeds_file_holds_it(tmp_path):
    """Checkpoint 0 is every fine-tuning run's encoder: its heads on its own states are in each
    seed's transfer file. Counted once; its heads on each seed's later checkpoint are two runs."""
    from bertvision.reporting.experiments import transfer_table

    def record(ft_seed, trained_on, evaluated_on, evaluated_ft_seed, accuracy):
        return {"backbone": "m", "task": "mrpc", "head": "lp", "ft_seed": ft_seed, "seed": 1, "train_fraction": 1.0,
                "trained_on": trained_on, "evaluated_on": evaluated_on, "evaluated_ft_seed": evaluated_ft_seed,
                "standardization": "source", "metrics": {"dev": {"accuracy": accuracy, "f1": accuracy}}}  # fmt: skip

    files = []
    for ft_seed, later in ((1, 0.7), (2, 0.8)):
        path = tmp_path / f"ft{ft_seed}.json"
        records = [record(1, "0", "0", 1, 0.6), record(1, "0", "0.3", ft_seed, later)]
        path.write_text(json.dumps({"task": "mrpc", "records": records}))
        files.append(path)
    table = transfer_table(files, []).set_index(["trained_on", "evaluated_on"])
    assert table.loc[("0", "0"), "n"] == 1 and table.loc[("0", "0"), "mean"] == pytest.approx(0.6)
    assert table.loc[("0", "0.3"), "n"] == 2 and table.loc[("0", "0.3"), "mean"] == pytest.approx(0.75)


def test_the_data_fraction_heads_are_finished_where_the_experiment_reads_them():
    """The curve's whole-data point is the main run's head: the race must not cut it short where
    the shares' heads train to their end (at the experiment's checkpoints, of its tasks)."""
    from bertvision.layout import Checkpoint
    from tests.conftest import workflow_settings

    s = workflow_settings(
        tasks={"mrpc": None, "rte": None},
        finetune={"epoch_fractions": [0, 0.3, 0.6]},
        experiments={"data_fraction": {"tasks": ["mrpc"], "heads": ["lp", "adapter64"], "checkpoints": [0.3]}},
    )
    assert s.finished_heads(s.run("m", "mrpc", 1, Checkpoint(0.3))) == ["adapter64", "lp"]
    assert s.finished_heads(s.run("m", "mrpc", 2, Checkpoint(0.3))) == ["adapter64", "lp"]
    assert s.finished_heads(s.run("m", "mrpc", 1, Checkpoint(0.6))) == []
    assert s.finished_heads(s.run("m", "rte", 1, Checkpoint(0.3))) == []


def test_a_task_whose_every_lp_run_the_race_stopped_keeps_its_layer_weights_row_marked(tmp_path):
    """It vanished from the plot without a word; a task with finished runs shows only those, at
    the last checkpoint where they finished."""
    from bertvision.reporting.plots import layer_weight_rows

    stopped = {"protocol": "racing", "raced_out_at_epoch": 2}
    runs = [  # (task, checkpoint, weights, race)
        ("sst2", "0.3", [0.1, 0.9], None),
        ("sst2", "0.3", [0.3, 0.7], None),
        ("sst2", "0.6", [0.9, 0.1], stopped),  # cut short: not the row's
        ("stsb", "0", [0.6, 0.4], stopped),
        ("stsb", "0.3", [0.2, 0.8], stopped),
    ]
    paths = []
    for number, (task, checkpoint, weights, race) in enumerate(runs):
        record = {"head": "lp", "task": task, "source": {"checkpoint": checkpoint}, "layer_weights": weights}
        paths.append(tmp_path / f"{number}.json")
        paths[-1].write_text(json.dumps({**record, **({"race": race} if race else {})}))
    matrix, labels = layer_weight_rows(paths)
    assert labels == ["sst2 (0.3 ep)", "stsb (0.3 ep, stopped early)"]
    assert np.allclose(matrix, [[0.2, 0.8], [0.2, 0.8]])


def test_the_peers_precision_is_in_the_timing_tables_list_under_the_job_that_ran_the_encoder():
    from bertvision.reporting.timing import stage_precisions

    peers = [
        {"task": "sst2", "peer": "lora", "precision": "bf16", "device": "cpu"},
        {"task": "sst2", "peer": "embedding", "precision": "fp32", "device": "cpu", "shared_encoding": True},
    ]
    found = stage_precisions([], [], [], [], peers)
    assert found == {("sst2", "peer"): "bf16 on cpu", ("sst2", "embed"): "fp32 on cpu"}


def test_the_experiment_tables_read_bert_at_checkpoints_the_race_did_not_reach_each_once():
    """The experiments fine-tune past where the race stopped: BERT's row there was left blank."""
    from bertvision.layout import Checkpoint
    from bertvision.plan.files import RunFiles
    from tests.conftest import workflow_settings

    s = workflow_settings(
        finetune={"epoch_fractions": [0, 0.3, 0.6], "seeds": [1, 2]}, experiments={"transfer": {"tasks": ["mrpc"]}}
    )
    reached = [s.run("m", "mrpc", 1, Checkpoint(0)), s.run("m", "mrpc", 1, Checkpoint(0.3))]
    records = RunFiles(s).experiment_bert_records(reached)
    assert len(records) == len(set(records)) == 5  # checkpoint 0 once, 0.3 and 0.6 of both fine-tuning seeds
    assert any("ft1/ckpt-0.6/" in path for path in records) and any("ft2/ckpt-0.6/" in path for path in records)


def test_a_head_the_race_stopped_under_one_fine_tuning_seed_is_no_pick_and_the_seed_served_is_by_its_best_run():
    """A race runs per fine-tuning seed's job: the best head here was stopped in seed 2's only; a
    mutant that needed it stopped in all of them made it the pick. The seed served is the one whose
    best head seed scored best (seed 1's 0.9 over seed 2's 0.8 and 0.8), not the best mean."""
    from bertvision.layout import Checkpoint
    from bertvision.reporting.choice import served_seed

    rows = [candidate("head", "lp", ft, 0.9, head="lp", ensemble=None, raced_out=ft == 2) for ft in (1, 2)]
    rows += [candidate("head", "ap", ft, 0.8, head="ap", ensemble=None, raced_out=False) for ft in (1, 2)]
    [picked] = choose_picks(pd.DataFrame(rows))
    assert picked.model == "ap"
    seeds = [candidate("head", "ap", 1, s) for s in (0.9, 0.5)] + [candidate("head", "ap", 2, s) for s in (0.8, 0.8)]
    assert served_seed(pd.DataFrame(seeds), "head", "ap", Checkpoint(1)) == 1


def test_every_candidates_selection_score_is_read_from_its_selection_split(tmp_path, monkeypatch):
    """The fixtures above copy dev into selection, so a candidate read from dev passed them: full
    fine-tuning's, a peer's and an ensemble's scores are the verdict's rival and the pick's."""
    from bertvision.evaluation.ensemble import ensemble_rules
    from bertvision.registry.tasks import get_task
    from tests.test_peers import write_peer

    monkeypatch.chdir(tmp_path)
    r = Records(Path("."))
    r.baseline("mrpc", 1, {"accuracy": 0.8, "f1": 0.8}, 60.0, extra={"constant_score": 0.68})
    record = json.loads(r.baselines[0].read_text())
    record["metrics"]["selection"] = {"accuracy": 0.6, "f1": 0.6, "constant_score": 0.5}
    r.baselines[0].write_text(json.dumps(record))
    r.bert_at("mrpc", 1.0, {"accuracy": 0.7, "f1": 0.7}, 20.0)
    r.head("mrpc", 1.0, "lp", 1, {"accuracy": 0.7, "f1": 0.7}, 8.0, selection={"accuracy": 0.65, "f1": 0.65})
    how = ensemble_rules(get_task("mrpc"))[0]
    record = json.loads(r.heads[0].read_text())
    record["ensembles"] = {how: {"selection": {"accuracy": 0.55, "f1": 0.55}, "dev": {"accuracy": 0.9, "f1": 0.9}}}
    r.heads[0].write_text(json.dumps(record))
    peer = write_peer(Path("."), "lora", "LoRA", 1, selection=0.45, dev=0.95, own=3.0, job=4.0)
    runs = candidate_runs(r.baselines, r.bert, r.heads, [], [], peer_metrics=[peer]).set_index("kind")
    assert runs.loc["full fine-tuning", "selection"] == 0.6 and runs.loc["peer", "selection"] == 0.45
    assert runs.loc["ensemble", "selection"] == 0.55 and runs.loc["head", "selection"] == 0.65
    assert runs.loc["full fine-tuning", "constant_score"] == 0.68  # the reported split's, the verdict's bar


def test_the_data_fraction_table_from_hand_written_records(tmp_path):
    """Subset runs and the same heads' full runs (mean ± std over seeds per share), a head trained
    on all rows only left out, BERT at the same checkpoint in the last column and BERT at another
    checkpoint nowhere; columns sorted by share and headed with their rows."""
    from bertvision.reporting.experiments import data_fraction_markdown, data_fraction_table

    def head(name, seed, fraction, examples, accuracy, checkpoint="0.3"):
        path = tmp_path / f"{name}-{seed}-{fraction}.json"
        path.write_text(json.dumps({
            "task": "mrpc", "head": name, "seed": seed, "train_fraction": fraction, "train_examples": examples,
            "source": {"model": "m", "checkpoint": checkpoint}, "metrics": {"dev": {"accuracy": accuracy}},
        }))  # fmt: skip
        return path

    def bert(checkpoint, accuracy):
        path = tmp_path / f"bert-{checkpoint}.json"
        path.write_text(json.dumps(
            {"model": "m", "task": "mrpc", "checkpoint": checkpoint, "metrics": {"dev": {"accuracy": accuracy}}}
        ))  # fmt: skip
        return path

    subsets = [head("lp", 1, 0.5, 50, 0.70), head("lp", 2, 0.5, 50, 0.72), head("lp", 1, 0.1, 10, 0.60)]
    full = [head("lp", 1, 1.0, 100, 0.80), head("ap", 1, 1.0, 100, 0.90)]
    table = data_fraction_table(subsets, full, [bert("0.3", 0.85), bert("1", 0.95)])
    lp = table[table["model"] == "lp"].set_index("train_fraction")
    assert list(lp.index) == [0.1, 0.5, 1.0] and lp.loc[0.5, "mean"] == pytest.approx(0.71)
    assert lp.loc[0.5, "n"] == 2 and lp.loc[1.0, "train_examples"] == 100
    assert set(table["model"]) == {"lp", "BERT"} and table.loc[table["model"] == "BERT", "mean"].tolist() == [0.85]
    page = data_fraction_markdown(table)
    assert "| model | 0.1 (10) | 0.5 (50) | 1 (100) |" in page
    assert "| BERT |  |  | 0.850 |" in page


def test_a_tables_whole_numbers_read_back_as_written(tmp_path):
    """A byte count held as a float (a mean over seeds) was written to 6 significant digits:
    1,023,648 feature bytes read back as 1,023,650 beside a manifest's exact count."""
    frame = pd.DataFrame({"feature_bytes": [1_023_648.0, np.nan], "score": [0.094280904, 2.0 / 3]})
    write_csv(frame, tmp_path / "t.csv")
    back = pd.read_csv(tmp_path / "t.csv")
    assert back["feature_bytes"][0] == 1_023_648 and np.isnan(back["feature_bytes"][1])
    assert list(back["score"]) == [0.0942809, 0.666667]


def test_berts_pick_in_the_cost_table_is_its_checkpoint_best_on_selection_not_on_dev(tmp_path):
    """BERT's own head that the cost table sets each head against: its checkpoint with the best
    selection score, 0.3 epochs (selection 0.72, dev 0.60), not 1 epoch (the best on dev, 0.80, and
    the last) nor the untouched encoder's (listed first)."""
    r = Records(tmp_path)
    r.bert_at("mrpc", 0.0, {"accuracy": 0.5, "f1": 0.5}, 0.0, selection={"accuracy": 0.5, "f1": 0.5})
    r.bert_at("mrpc", 1.0, {"accuracy": 0.8, "f1": 0.8}, 20.0, selection={"accuracy": 0.66, "f1": 0.66})
    r.bert_at("mrpc", 0.3, {"accuracy": 0.6, "f1": 0.6}, 7.0, selection={"accuracy": 0.72, "f1": 0.72})
    r.head("mrpc", 1.0, "lp", 1, {"accuracy": 0.7, "f1": 0.7}, 5.0)
    row = cost_table(r.bert, r.heads, [], []).iloc[0]
    assert row["bert_pick_checkpoint"] == 0.3
    assert row["bert_pick_score"] == pytest.approx(0.6) and row["bert_pick_finetune_s"] == 7.0
    assert row["bert_score"] == pytest.approx(0.8)  # BERT at the head's own checkpoint, beside it
    md = cost_markdown(cost_table(r.bert, r.heads, [], []))
    assert "BERT's pick: 0.600 at 0.3 epochs, 7.0 s of fine-tuning" in md


def test_the_timing_table_sums_a_stages_seconds_and_takes_its_largest_peak_read_from_the_log_first(
    tmp_path, monkeypatch
):
    """Per task and stage: the jobs' wall seconds summed (the benchmark files'), and the largest of
    their peaks, each job's from the usage line its log ends with (exact), else, a log without one,
    from its benchmark file's sampled max_rss (a job forked from the warm pool samples 17 MB there)."""
    from bertvision.jobs import Job
    from bertvision.layout import Checkpoint
    from bertvision.reporting.timing import timing_markdown, timing_table

    monkeypatch.chdir(tmp_path)
    run = {"task": "mrpc", "model": "tiny", "ftseed": 1, "checkpoint": Checkpoint(1)}
    # job, its wall seconds, its benchmark file's max_rss, its log's usage line's peak (None: no line)
    walls = [
        (Job("extract", {**run, "shard": 0}), 3.0, 250.0, None),
        (Job("extract", {**run, "shard": 1}), 4.0, 17.0, 900),
        (Job("extract", {**run, "shard": 2}), 5.0, 400.0, None),
        (Job("finetune", run), 20.0, 17.0, 1500),
    ]
    for job, seconds, max_rss, peak in walls:
        for path in (Path(job.benchmark), Path(job.log)):
            path.parent.mkdir(parents=True, exist_ok=True)
        Path(job.benchmark).write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:05\t{max_rss}\n")
        usage = f"job usage: peak memory {peak} MiB, cpu 1.0 s\n" if peak else ""
        Path(job.log).write_text("INFO started\n" + usage)
    table = timing_table([job for job, *_ in walls]).set_index("stage")
    assert table.loc["extract", "jobs"] == 3 and table.loc["finetune", "jobs"] == 1
    assert table.loc["extract", "seconds"] == pytest.approx(3 + 4 + 5)
    assert table.loc["extract", "max_rss_mb"] == 900  # shard 1's log; the benchmark files' largest is 400
    assert table.loc["finetune", "seconds"] == 20 and table.loc["finetune", "max_rss_mb"] == 1500
    assert "| mrpc | 20.0 | 12.0 | 32.0 |" in timing_markdown(table.reset_index())


def test_ranking_ties_edge_cases_and_a_frame_with_no_race():
    """Ties go to fewer parameters before the checkpoint; the one-standard-error rule looks only at
    strictly earlier checkpoints, at the best of each; a frame's NaN ``raced_out`` (no race ran)
    stops nothing."""
    import math

    import pandas as pd

    from bertvision.reporting.ranking import Candidate, ranked, ranked_frame

    small, large = Candidate("small", 0.8, 10, None), Candidate("large", 0.8, 100, 1.0)
    assert [c.name for c in ranked([large, small])] == ["small", "large"]
    # the same checkpoint as the best is not an earlier one, however close its score
    top, twin = Candidate("top", 0.81, 10, 1.0, runs=3, std=0.1), Candidate("twin", 0.8, 10, 1.0, runs=3, std=0.1)
    assert [c.name for c in ranked([twin, top])] == ["top", "twin"]
    # an earlier checkpoint within noise stands in with its best candidate, not its worst
    late = Candidate("late", 0.9, 10, 1.0, runs=3, std=0.1)
    good, poor = Candidate("good", 0.85, 10, 0.0, runs=3, std=0.1), Candidate("poor", 0.84, 10, 0.0, runs=3, std=0.1)
    assert [c.name for c in ranked([late, poor, good])][0] == "good"
    frame = pd.DataFrame({"model": ["a", "b"], "sel": [0.7, 0.6], "params": [1, 1], "raced_out": [math.nan, False]})
    assert list(ranked_frame(frame, "model", "sel", "params")["model"]) == ["a", "b"]
