"""Head training on synthetic features whose label lives in one layer: every head must learn
it, from memory and from the streaming reader alike."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertvision.config.settings import HeadRuntimeSettings, HeadTrainingSettings
from bertvision.errors import FeatureError
from bertvision.features.shard_writer import ShardWriter, shard_rows
from bertvision.features.store import write_manifest
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads
from tests.stages import with_training

SETTINGS = HeadTrainingSettings(
    learning_rate=5e-3,
    batch_size=16,
    max_epochs=15,
    patience=4,
    weight_decay=0.0,
    warmup_ratio=0.0,
    in_memory_max_mb=4096,
    standardize=True,
)
RUNTIME = HeadRuntimeSettings(device="cpu", verify="sha256")
HEADS = {
    "lp": {"type": "lp"},
    "ap": {"type": "mean"},
    "adapter": {"type": "adapter", "width": 8, "skip": True},
    "indep": {"type": "adapter", "width": 4, "shared": False},
}


def planted_states(rng, labels: np.ndarray, layers: int, hidden: int) -> np.ndarray:
    x = rng.normal(size=(len(labels), layers, hidden)) * 3.0
    x[:, 2, 0] = (2 * labels - 1) * 2.0 + rng.normal(size=len(labels)) * 0.5  # the signal: layer 2, dim 0
    x[:, 2, 1] += 50.0  # an outlier dimension with a large offset, as BERT states have
    return x


def planted_features(root, n_shards=2, signal_in="cls"):
    """Shards whose per-example states ``signal_in`` ('cls', or 'mean' with noise in 'cls') carry the label."""
    rng = np.random.default_rng(0)
    layers, hidden = 4, 16
    sizes = {"train": 400, "selection": 100, "dev": 200}
    for split, n in sizes.items():
        labels = rng.integers(0, 2, n)
        x = planted_states(rng, labels, layers, hidden)
        mean = None
        if signal_in == "mean":
            mean, x = x, rng.normal(size=x.shape) * 3.0
        for shard in range(n_shards):
            a, b = shard_rows(n, n_shards, shard)
            attrs = {
                "model": "m",
                "task": "sst2",
                "checkpoint": "1",
                "ft_seed": 1,
                "split": split,
                "label_kind": "classification",
                "encoder_parameters": 10_000,
                "row_start": a,
                "row_end": b,
                "split_rows": n,
            }
            path = root / f"shard-{shard}-of-{n_shards}" / f"{split}.h5"
            widths = {"cls": hidden, **({} if mean is None else {"mean": hidden})}
            with ShardWriter(path, b - a, layers, widths, "int64", attrs) as w:
                block = {"cls": x[a:b].astype(np.float16), **({} if mean is None else {"mean": mean[a:b]})}
                w.write_block(0, block, labels[a:b], np.arange(a, b))
    write_manifest(sorted(root.glob("shard-*")), root / "manifest.json", list(sizes))
    return root / "manifest.json"


@pytest.mark.parametrize("in_memory_max_mb", [4096, 0], ids=["in-memory", "streamed"])
def test_every_head_learns_the_planted_signal(tmp_path, in_memory_max_mb):
    manifest = planted_features(tmp_path / "features")
    settings = SETTINGS.replace(in_memory_max_mb=in_memory_max_mb)
    train_heads(
        get_task("sst2"), with_training(HEADS, settings), RUNTIME, manifest, [1, 2], tmp_path / "heads", threads=1
    )
    for name in HEADS:
        for seed in (1, 2):
            record = json.loads((tmp_path / "heads" / name / f"seed{seed}" / "metrics.json").read_text())
            assert record["data_in_memory"] is (in_memory_max_mb > 0)
            # AP averages the informative layer with three noise layers, so it can only beat chance.
            floor = 0.6 if name == "ap" else 0.9
            assert record["metrics"]["dev"]["accuracy"] > floor, (name, record["metrics"])
            assert 1 <= record["best_epoch"] <= SETTINGS.max_epochs
            assert (tmp_path / "heads" / name / f"seed{seed}" / "eval_predictions.parquet").exists()
    lp = json.loads((tmp_path / "heads" / "lp" / "seed1" / "metrics.json").read_text())
    weights = lp["layer_weights"]
    assert abs(sum(weights) - 1) < 1e-5 and int(np.argmax(weights)) == 2  # the mix found the informative layer


@pytest.mark.parametrize("in_memory_max_mb", [4096, 0], ids=["in-memory", "streamed"])
def test_a_head_reads_the_states_its_spec_names(tmp_path, in_memory_max_mb):
    """The label lives in the mean states only: the head that reads them learns it, the same head
    reading [CLS] in the same job cannot; a manifest without mean states refuses a mean head."""
    manifest = planted_features(tmp_path / "features", signal_in="mean")
    heads = {"lp": HEADS["lp"], "lp-mean": {"type": "lp", "reads": "mean"}}
    settings = SETTINGS.replace(in_memory_max_mb=in_memory_max_mb)
    train_heads(get_task("sst2"), with_training(heads, settings), RUNTIME, manifest, [1], tmp_path / "heads", threads=1)
    dev = {
        n: json.loads((tmp_path / "heads" / n / "seed1" / "metrics.json").read_text())["metrics"]["dev"] for n in heads
    }
    assert dev["lp-mean"]["accuracy"] > 0.9 and dev["lp"]["accuracy"] < 0.65, dev

    cls_only = planted_features(tmp_path / "cls-only")
    with pytest.raises(FeatureError, match="not 'mean'"):
        train_heads(
            get_task("sst2"), with_training(heads, settings), RUNTIME, cls_only, [1], tmp_path / "h2", threads=1
        )


def test_seeds_are_reproducible(tmp_path):
    manifest = planted_features(tmp_path / "features", n_shards=1)
    for run in ("a", "b"):
        train_heads(
            get_task("sst2"),
            with_training({"lp": HEADS["lp"]}, SETTINGS),
            RUNTIME,
            manifest,
            [3],
            tmp_path / run,
            threads=1,
        )
    a, b = (json.loads((tmp_path / r / "lp" / "seed3" / "metrics.json").read_text()) for r in "ab")
    assert a["metrics"] == b["metrics"] and a["layer_weights"] == b["layer_weights"]


def test_a_head_takes_its_own_training_settings(tmp_path):
    """heads.models.<name>.training overrides the task's settings for that head only, merged once
    when the config is read (``head_settings``); the job trains each head with the settings it
    is given. The record's spec is the head's architecture alone (what a bundle rebuilds it from)."""
    from tests.conftest import workflow_settings

    task_settings = SETTINGS.replace(patience=50)
    workflow = workflow_settings(
        tasks={"sst2": None},
        heads={
            "training": task_settings.to_dict(),
            "models": {"lp": {"type": "lp"}, "short": {"type": "lp", "training": {"max_epochs": 2}}},
        },
    )
    assert workflow.config["heads"]["models"]["short"]["training"] == {"max_epochs": 2}
    heads = workflow.head_settings("sst2")
    assert heads["short"].training == task_settings.replace(max_epochs=2) and heads["lp"].training == task_settings
    assert heads["short"].spec == {"type": "lp", "dropout": 0.0, "reads": "cls", "pair": "joint"}
    manifest = planted_features(tmp_path / "features", n_shards=1)
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1], tmp_path / "h", threads=1)
    records = {n: json.loads((tmp_path / "h" / n / "seed1" / "metrics.json").read_text()) for n in heads}
    assert len(records["short"]["history"]) == 2 and records["short"]["training_settings"]["max_epochs"] == 2
    assert len(records["lp"]["history"]) == SETTINGS.max_epochs
    assert records["short"]["head_spec"] == {"type": "lp", "dropout": 0.0, "reads": "cls", "pair": "joint"}


@pytest.mark.parametrize("in_memory_max_mb", [4096, 0], ids=["in-memory", "from-shards"])
def test_heads_trained_together_equal_each_trained_alone(tmp_path, in_memory_max_mb):
    """Every head of a seed trains in lockstep on batches drawn once; each keeps its own random
    state, optimizer and early stopping, so its weights and scores are bit-for-bit those it gets
    trained alone (a head with dropout draws random numbers on every step)."""
    manifest = planted_features(tmp_path / "features")
    settings = SETTINGS.replace(in_memory_max_mb=in_memory_max_mb, max_epochs=6, patience=2)
    heads = {**HEADS, "dropped": {"type": "adapter", "width": 8, "dropout": 0.3}}
    train_heads(get_task("sst2"), with_training(heads, settings), RUNTIME, manifest, [1, 2], tmp_path / "together",
                threads=1)  # fmt: skip
    for name in heads:
        for seed in (1, 2):
            alone = tmp_path / f"alone-{name}-{seed}"
            train_heads(get_task("sst2"), with_training({name: heads[name]}, settings), RUNTIME, manifest, [seed],
                        alone, threads=1)  # fmt: skip
            together = tmp_path / "together" / name / f"seed{seed}"
            weights = [load_file(d / "head.safetensors") for d in (together, alone / name / f"seed{seed}")]
            assert weights[0].keys() == weights[1].keys()
            assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), (name, seed)
            records = [json.loads((d / "metrics.json").read_text()) for d in (together, alone / name / f"seed{seed}")]
            for key in ("metrics", "best_epoch", "history"):
                assert records[0][key] == records[1][key], (name, seed, key)
            assert records[0]["runs_together"] == 2 * len(heads) and records[1]["runs_together"] == 1


def test_a_race_keeps_the_planted_best_head_and_stops_a_planted_bad_one_at_the_first_rung(tmp_path):
    """Racing on planted features: the head that cannot learn (a vanishing learning rate) is out
    at the first rung, the mean of the layers at the second, and only the layer mix, which finds
    the planted layer, trains with the other seeds. Its first-seed run is the grid's own."""
    from bertvision.config.settings import RaceSettings

    manifest = planted_features(tmp_path / "features", n_shards=1)
    settings = SETTINGS.replace(max_epochs=8, patience=8)
    heads = with_training({"lp": HEADS["lp"], "ap": HEADS["ap"], "stuck": HEADS["adapter"]}, settings)
    heads["stuck"] = heads["stuck"].replace(training=settings.replace(learning_rate=1e-9))
    race = RaceSettings(protocol="racing", rungs=(2, 4), keep=0.5, min_gain=0.005, checkpoint_rule="spread")
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], tmp_path / "raced", threads=1, race=race)
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], tmp_path / "grid", threads=1)

    def record(root, name, seed):
        return json.loads((tmp_path / root / name / f"seed{seed}" / "metrics.json").read_text())

    stuck, ap, lp = (record("raced", name, 1) for name in ("stuck", "ap", "lp"))
    assert stuck["race"]["raced_out_at_epoch"] == 2 and len(stuck["history"]) == 2
    assert ap["race"]["raced_out_at_epoch"] == 4 and len(ap["history"]) == 4
    assert lp["race"]["raced_out_at_epoch"] is None and lp["race"]["protocol"] == "racing"
    assert not (tmp_path / "raced" / "stuck" / "seed2").exists() and not (tmp_path / "raced" / "ap" / "seed2").exists()
    assert record("raced", "lp", 2)["race"]["raced_out_at_epoch"] is None
    grid = record("grid", "lp", 1)
    assert grid["race"] is None
    assert (lp["history"], lp["metrics"], lp["best_epoch"]) == (grid["history"], grid["metrics"], grid["best_epoch"])


def test_a_head_the_race_must_finish_trains_to_its_end_and_the_others_race_without_it(tmp_path):
    """``finish`` (a shared encoder's head): the head that cannot learn is never stopped and trains
    with every seed; of the other two, the keep share is taken among themselves alone."""
    from bertvision.config.settings import RaceSettings

    manifest = planted_features(tmp_path / "features", n_shards=1)
    settings = SETTINGS.replace(max_epochs=8, patience=8)
    heads = with_training({"lp": HEADS["lp"], "ap": HEADS["ap"], "stuck": HEADS["adapter"]}, settings)
    heads["stuck"] = heads["stuck"].replace(training=settings.replace(learning_rate=1e-9))
    race = RaceSettings(protocol="racing", rungs=(2, 4), keep=0.5, min_gain=0.005, checkpoint_rule="spread")
    out = tmp_path / "raced"
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], out, threads=1, race=race, finish=["stuck"])

    def record(name, seed):
        return json.loads((out / name / f"seed{seed}" / "metrics.json").read_text())

    assert record("stuck", 1)["race"]["raced_out_at_epoch"] is None and record("stuck", 2)["history"]
    assert record("ap", 1)["race"]["raced_out_at_epoch"] == 2 and not (out / "ap" / "seed2").exists()
    assert record("lp", 2)["race"]["raced_out_at_epoch"] is None


def test_the_first_fine_tuning_seeds_race_decides_what_the_others_train(tmp_path):
    """Two fine-tuning seeds' jobs at one checkpoint: the first races (the stuck head out at the
    first rung, the layer mean at the second); the second trains only what the first kept, with
    every seed to its end, so every candidate the ranking sees ran in both (one decision per
    candidate, not per job), and the ranking has a candidate."""
    from bertvision.config.settings import RaceSettings
    from bertvision.layout import head_metrics_files
    from bertvision.reporting.ranking import best, head_candidates

    manifest = planted_features(tmp_path / "features", n_shards=1)
    settings = SETTINGS.replace(max_epochs=8, patience=8)
    heads = with_training({"lp": HEADS["lp"], "ap": HEADS["ap"], "stuck": HEADS["adapter"]}, settings)
    heads["stuck"] = heads["stuck"].replace(training=settings.replace(learning_rate=1e-9))
    race = RaceSettings(protocol="racing", rungs=(2, 4), keep=0.5, min_gain=0.005, checkpoint_rule="spread")
    first, second = tmp_path / "ft1", tmp_path / "ft2"
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], first, threads=1, race=race)
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], second, threads=1, race=race, survivors_from=first)
    trained = {(p.parent.parent.name, p.parent.name) for p in head_metrics_files([second])}
    assert trained == {("lp", "seed1"), ("lp", "seed2")}
    record = json.loads((second / "lp" / "seed1" / "metrics.json").read_text())
    assert record["race"]["raced_out_at_epoch"] is None and record["race"]["decided_by"] == str(first)
    records = [json.loads(p.read_text()) for p in head_metrics_files([first, second])]
    top = best(head_candidates(get_task("sst2"), records))
    assert top is not None and top.name == "lp" and top.runs == 4


def test_a_later_seeds_job_trains_every_head_the_first_kept_without_racing_them_again(tmp_path):
    """Two of four heads survive the first seed's race; the second seed's job trains both with
    every head seed to the end. Raced again there, one was cut short on its own first head seed,
    and its record, marked decided by the first job, was a candidate."""
    from bertvision.config.settings import RaceSettings
    from bertvision.layout import head_metrics_files
    from bertvision.reporting.results import raced_out

    manifest = planted_features(tmp_path / "features", n_shards=1)
    settings = SETTINGS.replace(max_epochs=6, patience=6)
    heads = with_training(
        {"lp": HEADS["lp"], "ap": HEADS["ap"], "stuck": HEADS["adapter"], "stuck2": HEADS["adapter"]}, settings
    )
    for name in ("stuck", "stuck2"):
        heads[name] = heads[name].replace(training=settings.replace(learning_rate=1e-9))
    race = RaceSettings(protocol="racing", rungs=(2,), keep=0.5, min_gain=0.005, checkpoint_rule="spread")
    first, second = tmp_path / "ft1", tmp_path / "ft2"
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], first, threads=1, race=race)
    firsts = [json.loads(path.read_text()) for path in head_metrics_files([first])]
    kept = {r["head"] for r in firsts if not raced_out(r)}
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1, 2], second, threads=1, race=race, survivors_from=first)
    records = [json.loads(p.read_text()) for p in head_metrics_files([second])]
    assert {(r["head"], r["seed"]) for r in records} == {(h, s) for h in kept for s in (1, 2)}
    assert len(kept) == 2 and all(len(r["history"]) == 6 for r in records)


def test_a_head_stopped_by_a_race_is_never_picked():
    import pandas as pd

    from bertvision.reporting.choice import pick

    configs = pd.DataFrame(
        {
            "kind": ["head", "head"],
            "model": ["raced", "finished"],
            "checkpoint": [0.0, 0.0],
            "selection_mean": [0.9, 0.8],
            "trainable_params": [10, 10],
            "raced_out": [True, False],
        }
    )
    assert pick(configs)["model"] == "finished"
    assert pick(configs.drop(columns="raced_out"))["model"] == "raced"


class ScriptedSelection:
    """A real problem (its batches, loss and training) whose selection scores follow ``scores``, one
    an epoch, and which keeps each epoch's weights: the loop's keeping and stopping under test."""

    def __init__(self, problem, scores: list[float]):
        self.problem, self.scores, self.states = problem, iter(scores), []

    def __getattr__(self, name):
        return getattr(self.problem, name)

    def selection_metrics(self, head) -> dict:
        self.states.append({k: v.clone() for k, v in head.state_dict().items()})
        return {"accuracy": next(self.scores)}


@pytest.mark.parametrize(
    "scores, best_epoch, epochs, reported",
    [
        ([0.5, 0.6, 0.55, 0.7, 0.65, 0.6, 0.9, 0.9], 4, 6, 5),  # worse twice in a row after epoch 4: stopped at 6
        ([0.5, 0.6, 0.55, 0.7, 0.65, 0.8, 0.7, 0.75], 6, 8, 7),  # every epoch, the last its second worse one
        ([0.5, 0.6, 0.6, 0.6, 0.9, 0.9, 0.9, 0.9], 2, 4, 3),  # a tie is no better: the first of equals kept
    ],
)
def test_the_best_selection_epoch_is_kept_and_patience_counts_worse_epochs_in_a_row(
    tmp_path, scores, best_epoch, epochs, reported
):
    """Mutants of training/loop.py that kept the last epoch, counted every worse epoch, or never
    stopped passed every test: each would change a head's reported dev score."""
    from bertvision.training.loop import train_one
    from bertvision.training.problems import Problems

    task, spec = get_task("sst2"), {"type": "adapter", "width": 4}
    manifest = planted_features(tmp_path / "features", n_shards=1)
    scripted = ScriptedSelection(Problems(task, manifest, RUNTIME, 4096).get(spec), scores)
    settings = SETTINGS.replace(max_epochs=len(scores), patience=2)
    told = []  # what a search trial tells its pruner: not the epoch its patience ran out on (a worse one)
    head, best, history, _ = train_one(
        task, spec, settings, scripted, seed=1, device=torch.device("cpu"), on_epoch=lambda *e: told.append(e)
    )
    assert [h["epoch"] for h in history] == list(range(1, epochs + 1))
    assert best["epoch"] == best_epoch and best["score"] == scores[best_epoch - 1]
    assert told == [(e, scores[e - 1]) for e in range(1, reported + 1)]
    kept = head.state_dict()
    assert all(torch.equal(kept[k], v) for k, v in scripted.states[best_epoch - 1].items())
    if best_epoch != epochs:  # the head returned is not the last epoch's
        assert not all(torch.equal(kept[k], v) for k, v in scripted.states[-1].items())


def test_the_race_ranks_by_best_score_so_far_keeps_the_earlier_of_ties_and_rounds_the_kept_up(tmp_path):
    """Five runs, one rung at epoch 2, keep 0.5: three go on (at least half). A run whose best
    epoch was its first outranks one better at its last; of two equal runs the earlier stays."""
    from bertvision.training.loop import Lockstep, SeededHead
    from bertvision.training.problems import Problems
    from bertvision.training.racing import race

    task, spec = get_task("sst2"), {"type": "lp"}
    problem = Problems(task, planted_features(tmp_path / "features", n_shards=1), RUNTIME, 4096).get(spec)
    scores = {  # epochs 1 to 4; the rung ranks on epochs 1 and 2
        "a": [0.9, 0.1, 0.1, 0.1],  # best so far 0.9, worst of all at the rung
        "b": [0.6, 0.6, 0.6, 0.6],
        "c": [0.5, 0.7, 0.7, 0.7],
        "d": [0.6, 0.6, 0.6, 0.6],  # ties b, listed after it
        "e": [0.3, 0.3, 0.3, 0.3],
    }
    settings = SETTINGS.replace(max_epochs=4, patience=4)
    groups = [
        Lockstep(task, [SeededHead(name, spec, settings, 1)], ScriptedSelection(problem, run), torch.device("cpu"), 1)
        for name, run in scores.items()
    ]
    survivors = race(groups, rungs=(2,), keep=0.5)
    assert [s.run.name for s in survivors] == ["a", "b", "c"]
    assert {g.states[0].run.name: g.states[0].raced_out_at for g in groups} == {
        "a": None, "b": None, "c": None, "d": 2, "e": 2
    }  # fmt: skip
    assert [len(g.states[0].history) for g in groups] == [4, 4, 4, 2, 2]  # survivors to their end
