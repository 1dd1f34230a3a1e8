"""BERT's own fine-tuning curve (experiments.bert_curve): one run scored at every point, the
scoring leaving the training untouched; its table and plot from the records; the workflow plans
a job per task and seed."""

from __future__ import annotations

import json

import pytest
import yaml
from PIL import Image

from bertvision import layout as L
from bertvision.files import atomic_write_json
from bertvision.registry.tasks import get_task
from bertvision.reporting.bert_curve import bert_curve_markdown, bert_curve_table
from bertvision.reporting.experiment_plots import bert_curve_plot
from bertvision.stages.bert_curve import bert_curve
from bertvision.stages.experiment_tables import TABLE_NAMES
from tests.conftest import job_counts, snakemake, tiny_config, workflow_settings
from tests.stages import download_and_tokenize


def settings_with(model, points):
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(model)}},
        tasks={"mrpc": {"train_size": 44, "eval_size": 16}},
        baseline={"settings": {"batch_size": 8, "learning_rate": 1e-3}},
        experiments={"bert_curve": {"tasks": ["mrpc"], "points": points}},
        resources={"warm_start": False},
    )


@pytest.fixture(scope="module")
def tokens(tiny_bert, tmp_path_factory):
    settings = settings_with(tiny_bert, [1])
    return download_and_tokenize(settings, "tiny", "mrpc", tmp_path_factory.mktemp("curve"))


def run(root, tiny_bert, points, name):
    settings = settings_with(tiny_bert, points)
    compute = settings.finetune_compute().replace(device="cpu", precision="fp32")
    out = root / f"{name}.json"
    bert_curve(get_task("mrpc"), "tiny", settings.bert_curve("tiny", "mrpc"), compute, root / "tokens",
               root / "raw", out, 1, threads=1)  # fmt: skip
    return json.loads(out.read_text())


def test_the_curve_scores_every_point_without_disturbing_the_training(tokens, tiny_bert):
    # 40 training rows (10% held out for selection), batch 8: 5 steps a pass; 0.4 and 1.5 epochs
    # fall in the middle of a pass, and the schedule spans 1.5 epochs in both runs
    curve = run(tokens, tiny_bert, [1.5, 0.4, 1], "curve")
    assert curve["points"] == [0.4, 1, 1.5] and curve["steps_per_epoch"] == 5
    assert [p["epochs"] for p in curve["curve"]] == [0.4, 1, 1.5]
    assert [p["step"] for p in curve["curve"]] == [round(p * 5) for p in (0.4, 1, 1.5)] == [2, 5, 8]
    for point in curve["curve"]:
        assert set(point["metrics"]) == {"selection", "dev"}
        assert {"accuracy", "f1"} <= set(point["metrics"]["dev"])
    seconds = [p["train_seconds"] for p in curve["curve"]]
    assert seconds == sorted(seconds)
    assert curve["settings"]["points"] == [0.4, 1, 1.5] and curve["settings"]["batch_size"] == 8
    assert (curve["task"], curve["model"], curve["seed"], curve["backbone"]) == ("mrpc", "tiny", 1, str(tiny_bert))
    # the same run scored at its end only: scoring at 0.4 and 1 epoch changed nothing
    end = run(tokens, tiny_bert, [1.5], "end")
    assert [p["step"] for p in end["curve"]] == [8]
    last, alone = curve["curve"][-1], end["curve"][0]
    assert last["metrics"] == alone["metrics"] and last["train_loss_recent"] == alone["train_loss_recent"]


def test_the_curve_trains_with_the_baselines_settings_and_names_its_config_keys():
    from bertvision.errors import ConfigError

    settings = workflow_settings(
        baseline={"settings": {"learning_rate": 2e-5}}, experiments={"bert_curve": {"tasks": ["mrpc"]}}
    )
    curve = settings.bert_curve("m", "mrpc")
    assert curve.optimizer == settings.baseline("m", "mrpc").optimizer and curve.optimizer.learning_rate == 2e-5
    assert curve.points == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2, 3, 4, 5, 6)
    assert settings.bert_curve_tasks() == ["mrpc"] and settings.bert_curve_seeds() == [1]
    with pytest.raises(ConfigError, match=r"experiments.bert_curve.tasks: \['rte'\] are not configured tasks"):
        workflow_settings(experiments={"bert_curve": {"tasks": ["rte"]}})
    with pytest.raises(ConfigError, match=r"experiments.bert_curve.points"):
        workflow_settings(experiments={"bert_curve": {"tasks": ["mrpc"], "points": [0, 1]}})


def planted(path, seed, scores):
    """A bert_curve record of MRPC whose accuracy at each point is ``scores``' (selection, dev)."""
    curve = [
        {"epochs": epochs, "step": int(epochs * 10), "train_seconds": epochs, "train_loss_recent": 0.5,
         "metrics": {"selection": {"accuracy": sel, "f1": 0.0}, "dev": {"accuracy": dev, "f1": 0.0}}}
        for epochs, (sel, dev) in scores.items()
    ]  # fmt: skip
    record = {"task": "mrpc", "model": "m", "seed": seed, "points": list(scores), "curve": curve}
    atomic_write_json(record, path)
    return path


def test_the_table_and_page_are_mean_and_std_over_seeds(tmp_path):
    files = [
        planted(tmp_path / "1.json", 1, {0.5: (0.6, 0.7), 1: (0.7, 0.8)}),
        planted(tmp_path / "2.json", 2, {0.5: (0.8, 0.9), 1: (0.7, 0.6)}),
    ]
    table = bert_curve_table(files)
    assert len(table) == 4 and set(table["n"]) == {2} and set(table["metric"]) == {"accuracy"}
    row = table.set_index(["split", "epochs"]).loc[("dev", 0.5)]
    assert row["mean"] == pytest.approx(0.8) and row["std"] == pytest.approx(0.1414214)
    page = bert_curve_markdown(table)
    assert "## mrpc (m; accuracy)" in page
    assert "| epochs | selection | dev | n |" in page
    assert "| 0.5 | 0.700 ± 0.141 | 0.800 ± 0.141 | 2 |" in page
    assert "| 1 | 0.700 ± 0.000 | 0.700 ± 0.141 | 2 |" in page
    empty = bert_curve_table([])
    assert list(empty.columns) == list(table.columns) and not len(empty)
    assert "experiments.bert_curve.tasks" in bert_curve_markdown(empty)


def test_the_plot_draws_the_curve_or_says_it_is_not_configured(tmp_path):
    files = [planted(tmp_path / f"{s}.json", s, {p: (0.5 + p / 20, 0.5 + p / 30) for p in
                                                  (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2, 3, 4, 5, 6)})
             for s in (1, 2)]  # fmt: skip
    for name, table in (("curve", bert_curve_table(files)), ("empty", bert_curve_table([]))):
        table.to_csv(tmp_path / f"{name}.csv", index=False)
        bert_curve_plot(tmp_path / f"{name}.csv", tmp_path / f"{name}.png")
        assert Image.open(tmp_path / f"{name}.png").size[0] > 100
    assert "bert_curve" in TABLE_NAMES


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_the_workflow_plans_a_curve_per_task_and_seed_and_its_plot(tiny_bert, tmp_path):
    config = tiny_config(tiny_bert)
    config["experiments"]["bert_curve"] = {"tasks": ["mrpc", "stsb"], "points": [0.5, 1], "seeds": [1, 2]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", timeout=300).stdout
    counts = job_counts(out)
    assert counts["bert_curve"] == 4 and counts["plot_bert_curve"] == 1
    for task in ("mrpc", "stsb"):
        for seed in (1, 2):
            assert L.BERT_CURVE_FILE.format(model="tiny", task=task, seed=seed) in out


def test_a_squad_curve_is_written_on_its_0_to_100_scale(tmp_path):
    """SQuAD's F1 runs to 100: two decimals, as every other table prints it, not a 0-1 metric's three."""
    metrics = {"f1": 71.234, "exact": 60.0, "HasAns_f1": 0.0, "HasAns_exact": 0.0, "NoAns_f1": 0.0, "NoAns_exact": 0.0}
    curve = [{"epochs": 1, "step": 10, "train_seconds": 1.0, "train_loss_recent": 0.5,
              "metrics": {"selection": metrics, "dev": metrics}}]  # fmt: skip
    atomic_write_json({"task": "squad2", "model": "m", "seed": 1, "points": [1], "curve": curve}, tmp_path / "s.json")
    page = bert_curve_markdown(bert_curve_table([tmp_path / "s.json"]))
    assert "| 1 | 71.23 | 71.23 | 1 |" in page, page
