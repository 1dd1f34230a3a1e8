"""The optuna search: workers as separate processes on one study storage, pruning, the best
parameters flowing into the final training, and the data-fraction subsets."""

import json
import subprocess
import sys

import optuna
import pytest

from bertvision.config.settings import HeadSettings, SearchSettings
from bertvision.registry.tasks import get_task
from bertvision.stages.search import open_storage, study_name, summarize_study, worker_quota
from bertvision.stages.train_heads import train_heads
from bertvision.training.search_space import applicable_space, apply_params, unsearched
from bertvision.training.statistics import nested_subset
from tests.stages import with_training
from tests.test_train_head import RUNTIME, SETTINGS, planted_features

SEARCH = SearchSettings(
    trials=6,
    workers=2,
    seed=0,
    startup_trials=2,
    head_seed=1,
    pruner={"type": "median", "startup_trials": 1, "warmup_epochs": 1},
    space={
        "learning_rate": {"low": 1e-3, "high": 1e-2, "log": True},
        "batch_size": {"choices": [16, 32]},
        "max_epochs": {"low": 2, "high": 4},
        "width": {"choices": [4, 8]},
    },
)
ADAPTER = {"type": "adapter", "width": 8}
STUDY = {"model": "m", "task": "sst2", "ftseed": 1, "checkpoint": "1", "head": "adapter"}


def worker_command(manifest, storage, worker, out, search=SEARCH):
    return [
        sys.executable,
        "-m",
        "bertvision",
        "search-worker",
        "--task",
        "sst2",
        "--keys",
        json.dumps(STUDY),
        "--head",
        HeadSettings(spec=ADAPTER, training=SETTINGS).to_json(),
        "--runtime",
        RUNTIME.to_json(),
        "--search",
        search.to_json(),
        "--manifest",
        str(manifest),
        "--raw-dir",
        str(manifest.parent),
        "--storage",
        str(storage),
        "--worker",
        str(worker),
        "--out",
        str(out),
        "--threads",
        "1",
    ]


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_two_worker_processes_share_one_study(tmp_path, storage):
    manifest = planted_features(tmp_path / "features", n_shards=1)
    where = tmp_path / "study.journal" if storage == "journal" else f"sqlite:///{tmp_path / 'studies.db'}"
    outs = [tmp_path / f"worker-{w}.json" for w in range(2)]
    procs = [
        subprocess.Popen(
            worker_command(manifest, where, w, outs[w]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for w in range(2)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    workers = [json.loads(p.read_text()) for p in outs]
    assert workers[0]["study"] == workers[1]["study"]
    numbers = sorted(t["number"] for w in workers for t in w["trials"])
    assert numbers == list(range(SEARCH.trials))  # combined count, no number twice
    assert all(len(w["trials"]) == 3 for w in workers)
    # each worker's sampler has a seed of its own: with one, both drew the same first trial
    assert workers[0]["trials"][0]["params"] != workers[1]["trials"][0]["params"]
    best = summarize_study(outs, tmp_path / "best.json")
    assert best["trials"]["COMPLETE"] + best["trials"]["PRUNED"] == SEARCH.trials
    assert best["trial_numbers"] == list(range(SEARCH.trials))
    assert best["keys"] == STUDY
    assert set(best["best_params"]) == {"learning_rate", "batch_size", "max_epochs", "width"}
    assert 0.5 < best["best_value"] <= 1.0

    # A rerun of a worker resumes the finished study instead of adding trials.
    subprocess.run(worker_command(manifest, where, 0, outs[0]), check=True, capture_output=True)
    study = optuna.load_study(study_name=workers[0]["study"], storage=open_storage(str(where)))
    assert len(study.trials) == SEARCH.trials


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_each_worker_runs_its_own_share_whatever_the_order(tmp_path):
    """Three trials over two workers: worker 0 runs two and worker 1 one, even when worker 1 runs
    first. A cap on the study's count instead lets two workers that finish at once each start one
    more (CI saw four trials of three)."""
    assert [worker_quota(SEARCH.replace(trials=7, workers=3), w) for w in range(3)] == [3, 2, 2]
    with pytest.raises(ValueError, match="worker 2: search.workers is 2"):
        worker_quota(SEARCH, 2)
    manifest = planted_features(tmp_path / "features", n_shards=1)
    three = SEARCH.replace(trials=3)
    where = tmp_path / "study.journal"
    ran = {}
    for worker in (1, 0, 1):  # the second run of worker 1 resumes: nothing left to run
        out = tmp_path / f"worker-{worker}.json"
        subprocess.run(worker_command(manifest, where, worker, out, three), check=True, capture_output=True)
        ran[worker] = len(json.loads(out.read_text())["trials"])
    assert ran == {0: 2, 1: 1}
    study = optuna.load_study(study_name=json.loads(out.read_text())["study"], storage=open_storage(str(where)))
    assert len(study.trials) == 3


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_one_worker_makes_a_search_reproducible(tmp_path):
    """Each worker's sampler is seeded, so one worker (search.workers: 1) runs the same trials with the
    same parameters and scores on a rerun: the documented way to a reproducible search."""
    manifest = planted_features(tmp_path / "features", n_shards=1)
    one = SEARCH.replace(workers=1, trials=4)
    runs = []
    for rerun in range(2):
        out = tmp_path / f"worker-{rerun}.json"
        subprocess.run(worker_command(manifest, tmp_path / f"study-{rerun}.journal", 0, out, one), check=True,
                       capture_output=True)  # fmt: skip
        runs.append([(t["state"], t["value"], t["params"]) for t in json.loads(out.read_text())["trials"]])
    assert len(runs[0]) == 4
    assert len({json.dumps(t["params"], sort_keys=True) for t in json.loads(out.read_text())["trials"]}) > 1
    assert runs[0] == runs[1]


def test_best_parameters_train_the_final_head(tmp_path):
    manifest = planted_features(tmp_path / "features", n_shards=1)
    best = {
        "study": "s",
        "storage": "x",
        "space": {},
        "best_value": 0.9,
        "trials": {"COMPLETE": 3},
        "best_params": {"width": 4, "learning_rate": 0.004, "max_epochs": 3, "batch_size": 16},
    }
    (tmp_path / "best.json").write_text(json.dumps(best))
    train_heads(
        get_task("sst2"),
        with_training({"adapter": ADAPTER}, SETTINGS),
        RUNTIME,
        manifest,
        [1],
        tmp_path / "heads",
        threads=1,
        searched={"adapter": tmp_path / "best.json"},
    )
    record = json.loads((tmp_path / "heads" / "adapter" / "seed1" / "metrics.json").read_text())
    assert record["head_spec"]["width"] == 4
    assert record["training_settings"]["learning_rate"] == 0.004 and record["training_settings"]["max_epochs"] == 3
    assert len(record["history"]) <= 3
    assert record["search"]["best_params"] == best["best_params"]


def test_space_applies_architecture_parameters_only_to_heads_that_have_them():
    assert set(applicable_space(SEARCH.space, {"type": "lp"})) == {"learning_rate", "batch_size", "max_epochs"}
    assert "width" in applicable_space(SEARCH.space, ADAPTER)
    head = apply_params(HeadSettings(spec=ADAPTER, training=SETTINGS), {"width": 32, "learning_rate": 0.1})
    assert head.spec["width"] == 32 and head.training.learning_rate == 0.1 and ADAPTER["width"] == 8


def test_what_the_search_draws_reruns_no_search():
    """A search job's head is its settings less what every trial draws: a new learning rate or an
    adapter's width (both in the space) leaves the study and the job's params as they were (it reran
    every search); a key the space does not draw (patience) starts a new study."""
    head = HeadSettings(spec=ADAPTER, training=SETTINGS)
    start = unsearched(head, SEARCH.space)
    changed = HeadSettings(spec={**ADAPTER, "width": 16}, training=SETTINGS.replace(learning_rate=0.05))
    assert unsearched(changed, SEARCH.space).to_json() == start.to_json()
    assert unsearched(head.model_copy(update={"training": SETTINGS.replace(patience=9)}), SEARCH.space) != start
    assert start.training.batch_size in SEARCH.space["batch_size"]["choices"]


def test_study_name_changes_with_settings_and_features(tmp_path):
    manifest = planted_features(tmp_path / "a", n_shards=1)
    other = planted_features(tmp_path / "b", n_shards=2)
    name = study_name("x", ADAPTER, SETTINGS, SEARCH, manifest)
    assert name == study_name("x", ADAPTER, SETTINGS, SEARCH, manifest)
    assert name != study_name("x", ADAPTER, SETTINGS.replace(patience=9), SEARCH, manifest)
    assert name != study_name("x", ADAPTER, SETTINGS, SEARCH, other)
    # another count of trials or workers is another study: resumed, it would hold other trials than
    # that count's, and its cost would be the last job's alone
    # and every other search setting: the head seed every trial trains with among them
    changes = (
        {"trials": SEARCH.trials + 2},
        {"workers": SEARCH.workers + 1},
        {"startup_trials": 1},
        {"head_seed": SEARCH.head_seed + 1},
        {"seed": SEARCH.seed + 1},
        {"pruner": {"type": "none"}},
        {"space": {"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}}},
    )
    for changed in changes:
        assert name != study_name("x", ADAPTER, SETTINGS, SEARCH.replace(**changed), manifest), changed


def test_a_streamed_study_is_named_by_the_contents_of_its_weights_and_token_ids(tmp_path):
    """New data or a new fine-tuning run rewrites the same paths with files of the same size (the
    checkpoint-0 weights of another data seed are byte for byte the same size): the study's name
    read the paths and the weights' size, and the rerun worker resumed the finished study of the
    old states, training nothing."""
    from bertvision.features.source import StreamSource
    from tests.test_streaming import COMPUTE, EXTRACT

    checkpoint, tokens = tmp_path / "ckpt", tmp_path / "tokens"
    checkpoint.mkdir(), tokens.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights-a")
    (checkpoint / "config.json").write_text("{}")
    (tokens / "train.parquet").write_bytes(b"tokens-a")
    source = StreamSource(str(checkpoint), str(tokens), EXTRACT, COMPUTE, {"task": "sst2"})
    name = study_name("x", ADAPTER, SETTINGS, SEARCH, source)
    assert name == study_name("x", ADAPTER, SETTINGS, SEARCH, source)
    (checkpoint / "model.safetensors").write_bytes(b"weights-b")
    renamed = study_name("x", ADAPTER, SETTINGS, SEARCH, source)
    assert renamed != name
    (tokens / "train.parquet").write_bytes(b"tokens-b")
    assert study_name("x", ADAPTER, SETTINGS, SEARCH, source) not in (name, renamed)


def test_data_fraction_subsets_are_nested_and_train_on_that_share(tmp_path):
    small, large = nested_subset(1000, 0.1), nested_subset(1000, 0.3)
    assert len(small) == 100 and len(large) == 300 and set(small) <= set(large)
    assert nested_subset(1000, 1.0) is None
    manifest = planted_features(tmp_path / "features", n_shards=1)
    train_heads(
        get_task("sst2"),
        with_training({"lp": {"type": "lp"}}, SETTINGS),
        RUNTIME,
        manifest,
        [1],
        tmp_path / "heads",
        threads=1,
        train_fraction=0.25,
    )
    record = json.loads((tmp_path / "heads" / "lp" / "seed1" / "metrics.json").read_text())
    assert record["train_fraction"] == 0.25 and record["train_examples"] == 100
    streamed = SETTINGS.replace(in_memory_max_mb=0)
    with pytest.raises(ValueError, match="in_memory_max_mb"):
        train_heads(
            get_task("sst2"),
            with_training({"lp": {"type": "lp"}}, streamed),
            RUNTIME,
            manifest,
            [1],
            tmp_path / "h2",
            train_fraction=0.25,
        )


def test_successive_halving_stops_the_trials_that_trail():
    """search.pruner halving: optuna's successive halving races the trials on their selection
    score per epoch; the first trial scores best, most later ones stop early."""
    from bertvision.stages.search import build_pruner

    pruner = build_pruner({"type": "halving", "startup_trials": 0, "warmup_epochs": 1})
    assert isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner)
    study = optuna.create_study(direction="maximize", pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
    epochs_run = {}

    def objective(trial):
        for epoch in range(1, 9):
            epochs_run[trial.number] = epoch
            trial.report(1.0 if trial.number == 0 else 0.1 + 0.01 * trial.number, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return 1.0 if trial.number == 0 else 0.2

    study.optimize(objective, n_trials=8)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.COMPLETE and epochs_run[0] == 8
    assert states.count(optuna.trial.TrialState.PRUNED) >= 4
    assert sum(epochs_run.values()) < 8 * 8 / 2  # less than half the grid's epochs


def test_a_trials_value_is_its_best_epochs_selection_score_trained_with_the_head_seed(tmp_path):
    """The final head trains the best trial's parameters with heads.seeds' first seed: the search's
    value must be what that head scores on selection at its best epoch, not another seed's (the
    sampler's) or its last epoch's."""
    from bertvision.stages.search import build_pruner, run_worker

    assert isinstance(
        build_pruner({"type": "median", "startup_trials": 1, "warmup_epochs": 1}), optuna.pruners.MedianPruner
    )
    manifest = planted_features(tmp_path / "features", n_shards=1, signal_in="mean")  # [CLS]: noise to fit
    one = SEARCH.replace(trials=1, workers=1, startup_trials=1, seed=5, head_seed=1, pruner={"type": "none"})
    space = {**one.space, "max_epochs": {"low": 6, "high": 6}, "learning_rate": {"low": 0.05, "high": 0.05}}
    one = one.replace(space=space)
    head = HeadSettings(spec=ADAPTER, training=SETTINGS.replace(patience=6))
    out = tmp_path / "worker.json"
    journal = tmp_path / "s.journal"
    run_worker(get_task("sst2"), STUDY, head, RUNTIME, one, manifest, manifest.parent, str(journal), 0, out, threads=1)
    [trial] = json.loads(out.read_text())["trials"]
    best = {"study": "s", "storage": "x", "space": space, "best_value": trial["value"], "trials": {"COMPLETE": 1},
            "best_params": trial["params"]}  # fmt: skip
    (tmp_path / "best.json").write_text(json.dumps(best))
    heads = {"adapter": head.replace(training=SETTINGS.replace(patience=6))}
    train_heads(get_task("sst2"), heads, RUNTIME, manifest, [1], tmp_path / "heads", threads=1,
                searched={"adapter": tmp_path / "best.json"})  # fmt: skip
    record = json.loads((tmp_path / "heads" / "adapter" / "seed1" / "metrics.json").read_text())
    metric = get_task("sst2").primary_metric
    scores = [epoch["selection"][metric] for epoch in record["history"]]
    assert trial["value"] == pytest.approx(record["metrics"]["selection"][metric]) == pytest.approx(max(scores))
    assert scores[-1] != max(scores), "the planted run must peak before its last epoch to tell best from last"
    # every epoch the trial reported to its pruner is that head's selection score at that epoch
    study = optuna.load_study(study_name=json.loads(out.read_text())["study"], storage=open_storage(str(journal)))
    reported = study.trials[0].intermediate_values
    assert [reported[epoch] for epoch in sorted(reported)] == pytest.approx(scores)
