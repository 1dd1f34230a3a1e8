"""What the plan names, without running Snakemake: the files each job reads (so that a change to
any of them reruns it, and no job starts before what it reads exists) and a target for every
model, task and seed the config asks for."""

from __future__ import annotations

from bertvision import layout as L
from bertvision.jobs import timing_jobs
from bertvision.layout import Checkpoint
from bertvision.plan.files import RunFiles
from bertvision.plan.race import RaceReach
from bertvision.plan.targets import Targets
from tests.conftest import workflow_settings


def keys(checkpoint: str, ftseed: int = 1, model: str = "m") -> dict:
    return {"model": model, "task": "mrpc", "ftseed": str(ftseed), "checkpoint": checkpoint}


def test_a_checkpoints_extraction_shards_are_all_read_and_named_by_their_count():
    two, three = (RunFiles(workflow_settings(extract={"shards": n})).shard_dirs(keys("1")) for n in (2, 3))
    assert len(set(two)) == 2 and len(set(three)) == 3
    assert not set(two) & set(three)  # a changed shard count is new shards, not the old ones reused
    files = RunFiles(workflow_settings(extract={"shards": 2}))
    assert files.bert_scoring_inputs(keys("1"))["shards"] == two  # BERT scored from every shard's pass
    # checkpoint 0's head never trained: it is scored from the model, not from an extraction
    assert "shards" not in files.bert_scoring_inputs(keys("0")) and not files.scored_in_extraction(keys("0"))


def test_a_head_job_reads_the_checkpoints_weights_when_a_ladder_starts_from_them():
    ladder = {"side": {"type": "ladder", "init": "encoder"}}
    tokens = {"mrpc": {"token_features": True}}
    reads = RunFiles(workflow_settings(tasks=tokens, heads={"models": ladder})).features_input(keys("1"))
    plain = RunFiles(workflow_settings()).features_input(keys("1"))
    assert len(plain) == 1 and reads[: len(plain)] == plain
    assert len(reads) == 2 and reads[1].endswith("ckpt-1/model.safetensors")


def test_the_tables_read_every_jobs_benchmark_and_the_races_decisions():
    s = workflow_settings(extract={"shards": 2})
    runs = s.runs()
    decisions = ["results/m/mrpc/race/ckpt-0.json"]
    read = RunFiles(s).for_tables(runs, decisions)
    benchmarks = [job.benchmark for job in timing_jobs(runs, 2)]
    assert benchmarks and set(benchmarks) <= set(read) and decisions[0] in read


def test_a_transfer_job_applies_the_data_fraction_heads_of_the_checkpoints_they_trained_on():
    s = workflow_settings(
        experiments={
            "transfer": {"tasks": ["mrpc"]},
            "data_fraction": {"tasks": ["mrpc"], "fractions": [0.1, 0.5], "checkpoints": [1.0]},
        }
    )
    dirs = RunFiles(s).transfer_head_dirs(keys("1"))
    trained_on = s.run("m", "mrpc", 1, Checkpoint(1))
    subsets = [trained_on.format(L.SUBSET_HEADS_DIR, train_fraction=f) for f in (0.1, 0.5)]
    assert len(dirs) == len(s.checkpoints) + 2 and set(subsets) <= set(dirs)


def test_every_seed_fraction_and_backbone_the_config_names_has_its_targets():
    s = workflow_settings(
        backbones={"m": {"pretrained": "random:bert-base"}, "n": {"pretrained": "random:bert-base"}},
        finetune={"seeds": [1, 2]},
        baseline={"seeds": [1, 2, 3]},
        peers={"methods": ["embedding", "lora"]},
        experiments={
            "transfer": {"tasks": ["mrpc"]},
            "bert_curve": {"tasks": ["mrpc"], "seeds": [1, 2]},
            "data_fraction": {"tasks": ["mrpc"], "fractions": [0.1, 0.5], "checkpoints": [1.0]},
        },
    )
    targets = Targets(s)
    assert len(targets.baseline_jobs()) == 2 * 3  # backbones x baseline seeds
    assert len(set(targets.bert_curve_files())) == 2 * 2
    assert len(set(targets.transfer_files())) == 2 * 2  # backbones x fine-tuning seeds
    assert len(set(targets.subset_head_dirs())) == 2 * 2 * 2  # fractions x backbones x fine-tuning seeds
    assert len(targets.embed_jobs()) == 2  # the embedding reads them, LoRA does not: one per backbone


def test_a_race_reads_its_own_backbones_runs_and_a_first_seeds_job_waits_on_no_other():
    s = workflow_settings(
        backbones={"m": {"pretrained": "random:bert-base"}, "n": {"pretrained": "random:bert-base"}},
        finetune={"seeds": [1, 2]},
        heads={"race": {"protocol": "grid"}},
    )
    race = RaceReach(s, lambda model, task, checkpoint: f"{model}/{task}/{checkpoint}.json")
    runs = race.runs_of("m", "mrpc")
    assert runs and {run.model for run in runs} == {"m"}
    racing = RaceReach(workflow_settings(finetune={"seeds": [1, 2]}), lambda *k: "/".join(k))
    waits_on = racing.survivors("results/{model}/{task}/ft{ftseed}/ckpt-{checkpoint}/heads")
    assert waits_on(keys("1", ftseed=1)) == []
    assert waits_on(keys("1", ftseed=2)) == ["results/m/mrpc/ft1/ckpt-1/heads"]
    assert waits_on(keys("0", ftseed=2)) == []  # checkpoint 0's states are the first seed's own
