"""The race between checkpoints (heads.race, protocol racing): the decision at each checkpoint,
worked on planted head records."""

import json
import math

import pandas as pd
import pytest

from bertvision.config.settings import RaceSettings
from bertvision.layout import HEAD_METRICS, HEAD_WEIGHTS, Checkpoint, head_metrics_files, head_run_dir
from bertvision.registry.tasks import get_task
from bertvision.reporting.choice import pick
from bertvision.serving.bundle import BundleError
from bertvision.stages.race import best_candidate, decide_checkpoint

TASK = get_task("mrpc")
RACE = RaceSettings(protocol="racing", rungs=(2,), keep=0.5, min_gain=0.01, checkpoint_rule="spread")


def plant(heads_dir, head, seed, selection, raced_out=None, ensemble=None):
    run = head_run_dir(heads_dir, head, seed)
    run.mkdir(parents=True)
    record = {
        "task": TASK.name,
        "head": head,
        "seed": seed,
        "parameters": 1_000,
        "encoder_parameters": 22_000_000,
        "head_spec": {"type": "lp"},
        "metrics": {"selection": {TASK.primary_metric: selection}, "dev": {TASK.primary_metric: 1.0}},
        "race": {"protocol": "racing", "raced_out_at_epoch": raced_out},
        "ensembles": {} if ensemble is None else {"mean": {"selection": {TASK.primary_metric: ensemble}}},
    }
    (run / HEAD_METRICS).write_text(json.dumps(record))


def checkpoint_heads(tmp_path, name, scores):
    """One heads directory per fine-tuning seed: scores[ft_seed][head] = [selection per head seed]."""
    dirs = []
    for ft_seed, heads in enumerate(scores, start=1):
        d = tmp_path / f"ckpt-{name}" / f"ft{ft_seed}"
        for head, values in heads.items():
            for seed, value in enumerate(values, start=1):
                plant(d, head, seed, value)
        dirs.append(d)
    return dirs


def test_the_best_candidate_is_the_best_mean_over_every_run_and_raced_out_runs_do_not_count(tmp_path):
    dirs = checkpoint_heads(tmp_path, "0", [{"lp": [0.70, 0.72], "ap": [0.80, 0.60]}, {"lp": [0.71, 0.73]}])
    plant(dirs[0], "adapter", 1, 0.99, raced_out=2)  # stopped by the race: never the best
    best = best_candidate(TASK, dirs)
    assert best == {"candidate": "lp", "selection": pytest.approx(0.715), "runs": 4,
                    "standard_error": pytest.approx(0.012910 / 2, abs=1e-6)}  # fmt: skip


def test_a_head_the_race_stopped_in_one_seeds_job_is_no_candidate_for_the_race_the_pick_or_a_bundle(tmp_path):
    """Two fine-tuning seeds' jobs at one checkpoint: adapter survives seed 1's race with the best
    scores and is stopped in seed 2's. Counting only its finished runs would make it the race's
    best; the pick drops it; the one ranking drops it everywhere, and a bundle of the job that
    stopped it does not serve it."""
    from bertvision.reporting.ranking import Candidate, best, ranked_frame
    from bertvision.serving.bundle_writer import collect_runs, task_json

    dirs = checkpoint_heads(tmp_path, "0.3", [{"lp": [0.70, 0.72], "adapter": [0.90, 0.91]}, {"lp": [0.71, 0.73]}])
    plant(dirs[1], "adapter", 1, 0.95, raced_out=2)
    assert best_candidate(TASK, dirs)["candidate"] == "lp"

    configs = pd.DataFrame(
        {
            "model": ["adapter", "lp"],
            "selection_mean": [0.92, 0.715],
            "trainable_params": [5_000, 1_000],
            "checkpoint": [0.3, 0.3],
            "raced_out": [True, False],
        }
    )
    assert pick(configs)["model"] == "lp"
    assert list(ranked_frame(configs, "model", "selection_mean", "trainable_params", "checkpoint")["model"]) == ["lp"]
    # ties: fewer parameters, then the earlier checkpoint, then the name; a missing score never ranks
    tied = [Candidate("b", 0.8, 10, 1.0), Candidate("a", 0.8, 10, 1.0), Candidate("c", 0.8, 5, 1.0)]
    assert best(tied).name == "c" and best([Candidate("z", 0.8, 10, 1.0), Candidate("y", 0.8, 10, 0.3)]).name == "y"
    assert best([Candidate("nan", float("nan"), 1)]) is None
    # two heads' three selection scores whose means are equal but for the last bit (MRPC in the default run)
    first, second = sum([0.725, 0.7625, 0.7375]) / 3, sum([0.7375, 0.7375, 0.75]) / 3
    assert first < second and second - first < 1e-15
    assert best(
        [Candidate("adapter64-mean", second, 99_266, 0.0), Candidate("adapter64", first, 99_266, 0.0)]
    ).name == ("adapter64")

    for path in head_metrics_files(dirs):
        (path.parent / HEAD_WEIGHTS).touch()
    assert {run.head for run in collect_runs(TASK, [dirs[0]])} == {"lp", "adapter"}  # it ran to its end there
    runs = collect_runs(TASK, [dirs[1]])  # a bundle of seed 2's heads
    assert {run.head for run in runs} == {"lp"}
    served = task_json(TASK, {}, runs)
    assert set(served["heads"]) == {"lp"} and served["picked"] == "lp"
    with pytest.raises(BundleError, match="never served"):
        task_json(TASK, {"picked": "adapter"}, runs)


def test_the_best_candidate_may_be_a_head_with_bert_as_the_pick_would_take_it(tmp_path):
    dirs = [tmp_path / "ft1"]
    plant(dirs[0], "lp", 1, 0.70, ensemble=0.78)
    plant(dirs[0], "ap", 1, 0.75, ensemble=0.72)
    assert best_candidate(TASK, dirs) == {"candidate": "lp + BERT (mean)", "selection": pytest.approx(0.78), "runs": 1,
                                          "standard_error": 0.0}  # fmt: skip


def test_fine_tuning_goes_on_while_the_best_rises_by_more_than_min_gain(tmp_path):
    out = tmp_path / "race"
    at0 = decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "0", [{"lp": [0.70]}]), RACE,
                            out / "0.json")  # fmt: skip
    assert at0["go_on"] and at0["best_so_far"] == 0.70  # the first fine-tuned checkpoint always runs
    rising = decide_checkpoint(TASK, "m", Checkpoint(0.3), checkpoint_heads(tmp_path, "0.3", [{"lp": [0.75]}]),
                               RACE, out / "0.3.json", previous_decision=out / "0.json")  # fmt: skip
    assert rising["go_on"] and rising["best_before"] == 0.70 and rising["best_so_far"] == 0.75
    flat = decide_checkpoint(TASK, "m", Checkpoint(1), checkpoint_heads(tmp_path, "1", [{"ap": [0.755]}]),
                             RACE, out / "1.json", previous_decision=out / "0.3.json")  # fmt: skip
    assert not flat["go_on"] and "below 0.01" in flat["why"]  # +0.005, one run each: no spread to be within
    assert flat["best_so_far"] == 0.755
    assert json.loads((out / "1.json").read_text()) == flat


def test_a_gain_within_the_seeds_spread_of_the_bar_goes_on_where_the_gain_alone_stopped(tmp_path):
    """A planted noisy gain: lp scores 0.72 ± 0.02 over three head seeds on the untouched encoder and
    0.725 ± 0.024 over two fine-tuning seeds x two head seeds at 0.3 epochs. The gain, +0.005, is
    under min_gain 0.01, so the old rule (``gain``) stops there; its standard error (0.0166) puts
    the bar within the seeds' noise, so ``spread`` goes on. A gain as small whose seeds agree, and a
    clear loss, still stop."""
    out = tmp_path / "race"
    decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "0", [{"lp": [0.70, 0.74, 0.72]}]), RACE,
                      out / "0.json")  # fmt: skip
    noisy = checkpoint_heads(tmp_path, "0.3", [{"lp": [0.70, 0.74]}, {"lp": [0.71, 0.75]}])
    gain_rule = RACE.model_copy(update={"checkpoint_rule": "gain"})
    old = decide_checkpoint(
        TASK, "m", Checkpoint(0.3), noisy, gain_rule, out / "old.json", previous_decision=out / "0.json"
    )
    assert not old["go_on"] and "+0.0050 <= 0.01" in old["why"]
    new = decide_checkpoint(TASK, "m", Checkpoint(0.3), noisy, RACE, out / "new.json", previous_decision=out / "0.json")
    assert new["go_on"] and "+0.0050 ± 0.0166 (standard error), within noise of 0.01" in new["why"]
    assert new["best_so_far"] == pytest.approx(0.725) and new["best_so_far_error"] == pytest.approx(0.0119, abs=1e-4)

    decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "a", [{"lp": [0.72, 0.72, 0.72]}]), RACE,
                      out / "a.json")  # fmt: skip
    steady = checkpoint_heads(tmp_path, "b", [{"lp": [0.7249, 0.7251]}, {"lp": [0.7250, 0.7250]}])
    assert not decide_checkpoint(
        TASK, "m", Checkpoint(0.3), steady, RACE, out / "b.json", previous_decision=out / "a.json"
    )["go_on"]
    worse = checkpoint_heads(tmp_path, "c", [{"lp": [0.60, 0.64]}, {"lp": [0.61, 0.65]}])
    assert not decide_checkpoint(
        TASK, "m", Checkpoint(0.3), worse, RACE, out / "c.json", previous_decision=out / "0.json"
    )["go_on"]


def test_a_checkpoint_below_the_best_before_stops_and_the_last_one_never_goes_on(tmp_path):
    out = tmp_path / "race"
    decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "0", [{"lp": [0.80]}]), RACE, out / "0.json")
    worse = decide_checkpoint(TASK, "m", Checkpoint(0.3), checkpoint_heads(tmp_path, "0.3", [{"lp": [0.60]}]),
                              RACE, out / "0.3.json", previous_decision=out / "0.json")  # fmt: skip
    assert not worse["go_on"] and worse["best_so_far"] == 0.80
    last = decide_checkpoint(TASK, "m", Checkpoint(1), checkpoint_heads(tmp_path, "1", [{"lp": [0.99]}]),
                             RACE, out / "1.json", previous_decision=out / "0.3.json", last=True)  # fmt: skip
    assert not last["go_on"] and last["last"] and not worse["last"]


def test_a_checkpoint_where_no_head_scored_stops_and_writes_plain_json(tmp_path):
    """Every head's selection score NaN: no best, no infinity in the record, fine-tuning stops."""
    out = tmp_path / "race"
    decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "0", [{"lp": [0.70]}]), RACE, out / "0.json")
    nothing = decide_checkpoint(TASK, "m", Checkpoint(0.3), checkpoint_heads(tmp_path, "0.3", [{"lp": [float("nan")]}]),
                                RACE, out / "0.3.json", previous_decision=out / "0.json")  # fmt: skip
    assert nothing["best"] is None and not nothing["go_on"] and nothing["best_so_far"] == 0.70
    first = decide_checkpoint(TASK, "m", Checkpoint(0), checkpoint_heads(tmp_path, "x", [{"lp": [float("nan")]}]),
                              RACE, out / "x.json")  # fmt: skip
    assert first["go_on"] and first["best_so_far"] is None
    assert "Infinity" not in (out / "x.json").read_text() and "NaN" not in (out / "x.json").read_text()


def test_the_race_at_its_edges(tmp_path):
    """A gain exactly at min_gain stops; the spread rule reaches one standard error, not two; the
    gain is over the best so far, not over the checkpoint before; a checkpoint after one where no
    head scored goes on with a score; a run whose only checkpoint is its last does not go on."""
    out = tmp_path / "race"

    def decide(name, scores, previous=None, race=RACE, last=False):
        fraction = {"0": 0, "0.3": 0.3, "1": 1}[name.split("-")[0]]
        dirs = checkpoint_heads(tmp_path / name, name, scores)
        before = out / f"{previous}.json" if previous else None
        return decide_checkpoint(
            TASK, "m", Checkpoint(fraction), dirs, race, out / f"{name}.json", previous_decision=before, last=last
        )

    quarter = RACE.model_copy(update={"min_gain": 0.25})  # 0.5 -> 0.75: a gain of exactly 0.25, in binary too
    decide("0-exact", [{"lp": [0.5]}], race=quarter)
    for rule in ("gain", "spread"):
        rule_race = quarter.model_copy(update={"checkpoint_rule": rule})
        assert not decide(f"0.3-exact-{rule}", [{"lp": [0.75]}], "0-exact", rule_race)["go_on"]
    decide("0-se", [{"lp": [0.70]}])
    one_error = decide("0.3-se", [{"lp": [0.700, 0.708]}], "0-se")  # +0.004 ± 0.004: 0.008 < 0.01 < 0.012
    assert not one_error["go_on"] and "below 0.01" in one_error["why"]
    decide("0-drop", [{"lp": [0.80]}])
    assert decide("0.3-drop", [{"lp": [0.70]}, {"lp": [0.86]}], "0-drop")["go_on"]  # -0.02 ± 0.08: within noise
    recovered = decide("1-drop", [{"lp": [0.795]}], "0.3-drop")  # +0.015 over 0.78, but -0.005 under 0.80
    assert not recovered["go_on"] and recovered["best_before"] == 0.80
    decide("0-none", [{"lp": [float("nan")]}])
    assert decide("0.3-none", [{"lp": [0.70]}], "0-none")["go_on"]
    assert not decide("0-last", [{"lp": [0.70]}], last=True)["go_on"]


def test_min_gain_is_a_share_of_the_metric_scale(tmp_path):
    """SQuAD's F1 runs to 100: a min_gain of 0.01 is one point there."""
    squad = get_task("squad2")
    out = tmp_path / "race"

    def heads(name, value):
        d = tmp_path / name
        run = head_run_dir(d, "lp", 1)
        run.mkdir(parents=True)
        (run / HEAD_METRICS).write_text(
            json.dumps({"head": "lp", "parameters": 1000, "metrics": {"selection": {squad.primary_metric: value}}})
        )
        return [d]

    decide_checkpoint(squad, "m", Checkpoint(0), heads("a", 40.0), RACE, out / "0.json")
    decide_checkpoint(
        squad, "m", Checkpoint(0.3), heads("b", 45.0), RACE, out / "0.3.json", previous_decision=out / "0.json"
    )
    small = decide_checkpoint(
        squad, "m", Checkpoint(1), heads("c", 45.5), RACE, out / "1.json", previous_decision=out / "0.3.json"
    )
    assert not small["go_on"]  # +0.5 F1 <= 1 point


@pytest.mark.slow
def test_a_racing_run_stops_fine_tuning_where_the_selection_score_stops_rising(tiny_bert, tmp_path):
    """Through Snakemake: checkpoints 0, 0.5 and 1 with a min_gain no head can reach. The race
    fine-tunes to 0.5 (the first fine-tuned checkpoint always runs), decides there to stop, and
    nothing of checkpoint 1 is trained, extracted or read; the tables, the summary and the picked
    bundle hold checkpoints 0 and 0.5 only, and the timing table counts the jobs that ran."""
    import pandas as pd
    import yaml

    from bertvision.layout import RACE_DECISION
    from tests.conftest import SHIPPED_GLUE, snakemake

    config = {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {"glue_dir": str(SHIPPED_GLUE), "selection_fraction": 0.2},
        "tasks": {"mrpc": {"train_size": 50, "eval_size": 30}},
        "finetune": {"epoch_fractions": [0, 0.5, 1.0], "settings": {"batch_size": 8}},
        "baseline": {"epochs": 1, "seeds": [1]},
        "resources": {"threads": 1},
        "experiments": {"data_fraction": {"tasks": []}, "transfer": {"tasks": []}},
        "heads": {
            "seeds": [1, 2],
            "training": {"max_epochs": 2, "patience": 1, "batch_size": 16},
            "models": {"lp": {"type": "lp"}, "ap": {"type": "mean"}},
            "race": {"protocol": "racing", "rungs": [1], "keep": 0.5, "min_gain": 1.0},
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake(tmp_path)
    decisions = [json.loads((tmp_path / RACE_DECISION.format(model="tiny", task="mrpc", checkpoint=f)).read_text())
                 for f in ("0", "0.5")]  # fmt: skip
    assert [d["go_on"] for d in decisions] == [True, False]
    assert decisions[1]["best_before"] == decisions[0]["best_so_far"]
    assert not (tmp_path / RACE_DECISION.format(model="tiny", task="mrpc", checkpoint="1")).exists()
    for never in ("models/tiny/mrpc/ft1/ckpt-1", "features/tiny/mrpc/ft1/ckpt-1", "heads/tiny/mrpc/ft1/ckpt-1"):
        assert not (tmp_path / never).exists(), never
    glue = pd.read_csv(tmp_path / "results/tables/glue.csv")
    assert set(glue["checkpoint"]) == {0.0, 0.5}
    timing = pd.read_csv(tmp_path / "results/tables/timing.csv")
    assert timing.set_index("stage").loc["finetune", "jobs"] == 2  # checkpoints 0 and 0.5
    summary = (tmp_path / "results/tables/summary.md").read_text()
    assert "Checkpoints raced" in summary and "fine-tuning stopped after checkpoint 0.5" in summary
    from bertvision.reporting.picks import read_picks

    assert {p.checkpoint.fraction for p in read_picks(tmp_path / "results/tables/picks.json")} <= {0.0, 0.5}


def test_the_race_reach_stops_where_a_decision_stops_fine_tuning(tmp_path):
    """RaceReach (rules/common.smk's RACE): the checkpoints, runs and decision files the pick chose
    among end at the first decision that stops fine-tuning; the grid reaches every checkpoint and
    takes no decision; a later seed's head job at a fine-tuned checkpoint waits on the first seed's."""
    import json as json_module

    from bertvision import layout as L
    from bertvision.plan.race import RaceReach
    from tests.conftest import workflow_settings

    finetune = {"epoch_fractions": [0, 0.3, 1], "seeds": [1, 2]}
    settings = workflow_settings(finetune=finetune)
    asked = []

    def decision_file(model, task, checkpoint):
        asked.append(checkpoint)
        path = tmp_path / f"{task}-{checkpoint}.json"
        path.write_text(json_module.dumps({"go_on": checkpoint == "0"}))  # go on after 0, stop after 0.3
        return str(path)

    race = RaceReach(settings, decision_file)
    assert [c.name for c in race.checkpoints("m", "mrpc")] == ["0", "0.3"] and asked == ["0", "0.3"]
    assert {(r.ftseed, r.checkpoint.name) for r in race.runs()} == {(1, "0"), (1, "0.3"), (2, "0.3")}
    assert race.decisions() == [L.RACE_DECISION.format(model="m", task="mrpc", checkpoint=f) for f in ("0", "0.3")]
    job = {"model": "m", "task": "mrpc", "ftseed": "2", "checkpoint": "0.3"}
    assert race.survivors(L.HEADS_DIR)(job) == [L.HEADS_DIR.format(**{**job, "ftseed": 1})]
    assert race.survivors(L.HEADS_DIR)({**job, "checkpoint": "0"}) == []
    assert race.decision_inputs(job)["previous"] == [L.RACE_DECISION.format(model="m", task="mrpc", checkpoint="0")]

    grid = RaceReach(workflow_settings(finetune=finetune, heads={"race": {"protocol": "grid"}}), decision_file)
    assert [c.name for c in grid.checkpoints("m", "mrpc")] == ["0", "0.3", "1"] and grid.decisions() == []
    assert grid.survivors(L.HEADS_DIR)(job) == []


def test_two_backbones_race_apart_and_each_serves_its_own_picks(tiny_bert, tmp_path):
    """Two backbones under racing: each backbone's picked bundles read only its own race's
    decisions (planning stopped with "Rule parameter depends on checkpoint but checkpoint output
    is not defined as input file" when one backbone's rule read the other's race)."""
    import yaml

    from tests.conftest import SHIPPED_GLUE, job_counts, snakemake

    config = {
        "backbones": {"one": {"pretrained": str(tiny_bert)}, "two": {"pretrained": str(tiny_bert)}},
        "data": {"glue_dir": str(SHIPPED_GLUE), "selection_fraction": 0.2},
        "tasks": {"mrpc": {"train_size": 50, "eval_size": 30, "peers": []}},
        "finetune": {"epoch_fractions": [0, 0.5], "seeds": [1]},
        "baseline": {"enabled": False},
        "experiments": {"data_fraction": {"tasks": []}, "transfer": {"tasks": []}},
        "heads": {"seeds": [1], "models": {"lp": {"type": "lp"}}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    counts = job_counts(snakemake(tmp_path, "-n").stdout)
    assert counts["serve_bundles"] == 2 and counts["race_checkpoint"] == 2, counts


def test_the_ranking_rules_one_by_one():
    """Each rule of reporting.ranking, which the race, the pick and the bundles share; mutants of
    each (scores rounded to 2 digits, the latest checkpoint within noise, a strict bound) passed."""
    from bertvision.reporting.ranking import Candidate, ranked

    # a better score wins over fewer parameters, however close (3 thousandths here)
    names = [c.name for c in ranked([Candidate("small", 0.801, 10, 1.0), Candidate("big", 0.804, 1000, 1.0)])]
    assert names == ["big", "small"]
    # of the earlier checkpoints within noise of the best (a later one), the earliest is first
    top = Candidate("late", 0.80, 10, 1.0, runs=4, std=0.02)  # standard error 0.01
    within = [
        top,
        Candidate("mid", 0.795, 10, 0.3, runs=4, std=0.02),
        Candidate("zero", 0.79, 10, 0.0, runs=4, std=0.02),
    ]
    assert [c.name for c in ranked(within)] == ["zero", "late", "mid"]
    # beyond noise: the better one stays first
    far = [top, Candidate("zero", 0.70, 10, 0.0, runs=4, std=0.02)]
    assert [c.name for c in ranked(far)] == ["late", "zero"]
    # single runs measure no noise: an earlier checkpoint's equal score is within it (the bound is <=)
    tie = [Candidate("late", 0.8, 5, 1.0), Candidate("early", 0.8, 50, 0.0)]
    assert [c.name for c in ranked(tie)] == ["early", "late"]
    # equal score and size: the earlier checkpoint first, and the noise is its (none here), not the later one's
    same = [Candidate("lp", 0.70, 10, 0.0), Candidate("ap", 0.80, 10, 0.3, runs=2, std=0.0),
            Candidate("ap", 0.80, 10, 1.0, runs=2, std=0.3)]  # fmt: skip
    assert ranked(same)[0].checkpoint == 0.3
    # at equal scores a candidate whose size is not known comes after one whose size is (a peer's record without it)
    unknown = [Candidate("a-unknown", 0.8, math.nan), Candidate("b-large", 0.8, 10**9)]
    assert [c.name for c in ranked(unknown)] == ["b-large", "a-unknown"]


def test_a_bundle_serves_each_heads_best_seed_on_selection_with_its_own_scores(tmp_path):
    """Per head, the seed served is the best on selection (a tie: the lower seed; a seed with no
    score never); the entry lists every seed and their mean (null where none has a score), and
    an ensemble's entry carries the ensemble's own dev scores, not its bare head's."""
    from bertvision.serving.bundle_writer import collect_runs, task_json

    heads = tmp_path / "ft1"
    for seed, score in ((1, 0.6), (2, 0.7), (3, 0.7)):
        plant(heads, "lp", seed, score)
    plant(heads, "ap", 1, float("nan"))
    plant(heads, "ap", 2, 0.5, ensemble=0.75)
    plant(heads, "cnn", 1, float("nan"))
    ensemble_record = head_run_dir(heads, "ap", 2) / HEAD_METRICS
    record = json.loads(ensemble_record.read_text())
    record["ensembles"]["mean"]["dev"] = {TASK.primary_metric: 0.9}
    ensemble_record.write_text(json.dumps(record))
    for path in head_metrics_files([heads]):
        (path.parent / HEAD_WEIGHTS).touch()
    served = task_json(TASK, {"ensemble": {"head": "ap", "how": "mean"}}, collect_runs(TASK, [heads]))["heads"]
    assert (served["lp"]["seed"], served["lp"]["seeds"]) == (2, [1, 2, 3])
    assert served["lp"]["mean_selection_score"] == pytest.approx(2 / 3)
    assert served["ap"]["seed"] == 2 and served["cnn"]["mean_selection_score"] is None
    assert served["ap"]["eval_metrics"] == {"dev": {TASK.primary_metric: 1.0}}
    assert served["ap + BERT (mean)"]["eval_metrics"] == {"dev": {TASK.primary_metric: 0.9}}


def test_a_mean_one_selection_row_better_is_no_tie_though_it_rounds_alike(tmp_path):
    """Three head seeds on a 500-row selection split: ap gets 376, 376 and 377 rows right (mean
    0.75267), lp 376, 377 and 377 (0.75333), one row more in all. Both round to 0.753 at three
    digits, where the tie would go to ap by name; lp is better and ranks first in the race and the
    pick (a mutant rounding scores to three digits passed every test)."""
    dirs = checkpoint_heads(tmp_path, "0", [{"ap": [0.752, 0.752, 0.754], "lp": [0.752, 0.754, 0.754]}])
    best = best_candidate(TASK, dirs)
    assert (best["candidate"], best["selection"]) == ("lp", pytest.approx(1130 / 1500))
    configs = pd.DataFrame(
        {
            "model": ["ap", "lp"],
            "selection_mean": [1129 / 1500, 1130 / 1500],
            "trainable_params": [1_000, 1_000],
            "checkpoint": [0.0, 0.0],
        }
    )
    assert pick(configs)["model"] == "lp"
