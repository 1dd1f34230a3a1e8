"""End to end through Snakemake on a tiny random BERT (real vocab) and a few dozen examples per
task: the tables, a second run with nothing to do, and a head change that reruns only head
training and the tables. Every test reads the session's one run of ``tiny_config``
(tests/conftest.py: ``tiny_workflow``); the ones that change something change a copy of it."""

from __future__ import annotations

import base64
import copy
import json
import re

import pandas as pd
import pytest
import yaml

from bertvision import layout as L
from bertvision.jobs import embed_job
from tests.conftest import REPO, copy_workdir, job_counts, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture
def workflow_run(tiny_workflow):
    """The session's tiny run (tests/conftest.py): its working directory, shared (tests that
    change it work on a copy), and a copy of its config of their own."""
    return tiny_workflow.workdir, tiny_workflow.config


def test_tables_have_every_row(workflow_run):
    workdir, config = workflow_run
    table = pd.read_csv(workdir / "results" / "tables" / "glue.csv")
    for task, metrics in (("mrpc", {"f1", "accuracy"}), ("stsb", {"pearson", "spearman"})):
        # token features: mrpc only (the token-level heads)
        heads = ("lp", "adapter8", "tokpool", "ladder") if task == "mrpc" else ("lp", "adapter8")
        ensembles = {f"{h} + BERT (mean)" for h in heads}
        rows = table[table["task"] == task]
        assert set(rows["split"]) == {"dev"}
        assert set(rows["checkpoint"]) == {0.0, 1.0}
        assert set(rows["metric"]) == metrics
        # checkpoint 0's head has not trained: no BERT row and no ensemble there
        assert set(rows[rows["checkpoint"] == 0.0]["model"]) == set(heads)
        block = rows[rows["checkpoint"] == 1.0]
        # STS-B (regression) averages the two predictions and MRPC has two classes (max and
        # mean pick the same class): one ensemble row each, in its own section.
        assert set(block["model"]) == {"BERT", *heads, *ensembles}
        assert set(block.loc[block["ensemble"], "model"]) == ensembles
        assert (rows[rows["model"] != "BERT"]["n"] == 2).all()  # 1 fine-tuning seed x 2 head seeds
    md = (workdir / "results" / "tables" / "glue.md").read_text()
    assert "## mrpc (tiny, dev)" in md and "## stsb (tiny, dev)" in md and "squad2" not in md
    assert md.index("# Head + BERT ensembles") > md.rindex("| BERT |")  # ensembles in their own section
    both = pd.read_csv(workdir / "results" / "tables" / "squad.csv")
    squad = both[both["task"] == "squad2"]
    # the ladder reads whole windows: start/end logits per token
    assert set(squad[squad["checkpoint"] == 1.0]["model"]) == {
        "BERT",
        *(f"{h}{e}" for h in ("lp", "ladder") for e in ("", " + BERT (max)", " + BERT (mean)")),
    }
    assert set(squad[squad["checkpoint"] == 0.0]["model"]) == {"lp", "ladder"}
    assert {"f1", "exact", "HasAns_f1", "NoAns_exact"} <= set(squad["metric"])
    assert "## squad2 (tiny, dev)" in (workdir / "results" / "tables" / "squad.md").read_text()
    answerable = both[both["task"] == "squad2-answerable"]
    assert set(answerable["metric"]) == {"accuracy", "f1", "accuracy_any_no", "f1_any_no"}
    assert {"BERT", "lp", "adapter8"} <= set(answerable["model"])
    assert set(answerable["checkpoint"]) == {0.0, 1.0}
    assert answerable["mean"].between(0, 1).all()
    timing = pd.read_csv(workdir / "results" / "tables" / "timing.csv")
    assert {"download", "tokenize", "finetune", "baseline", "extract", "train_heads"} <= set(timing["stage"])


def test_table_numbers_equal_the_metrics_files(workflow_run):
    workdir, _ = workflow_run
    table = pd.read_csv(workdir / "results" / "tables" / "glue.csv").set_index(
        ["task", "checkpoint", "model", "metric"]
    )
    for checkpoint in ("0", "1"):
        values = [
            json.loads((workdir / f"heads/tiny/mrpc/ft1/ckpt-{checkpoint}/lp/seed{s}/metrics.json").read_text())
            for s in (1, 2)
        ]
        f1s = [v["metrics"]["dev"]["f1"] for v in values]
        row = table.loc[("mrpc", float(checkpoint), "lp", "f1")]
        assert row["mean"] == pytest.approx(sum(f1s) / 2, abs=1e-5)
    bert = json.loads((workdir / "models/tiny/mrpc/ft1/ckpt-1/eval_metrics.json").read_text())
    assert table.loc[("mrpc", 1.0, "BERT", "accuracy")]["mean"] == pytest.approx(
        bert["metrics"]["dev"]["accuracy"], abs=1e-5
    )
    # BERT scored from the extraction's pass where the states are stored (mrpc: 2 shards of every
    # token's states; squad2: spans), by its own where they are streamed (stsb)
    for task, source in (("mrpc", "extraction"), ("squad2", "extraction"), ("stsb", "own pass")):
        scored = json.loads((workdir / f"models/tiny/{task}/ft1/ckpt-1/eval_metrics.json").read_text())
        assert scored["scored_from"] == source and scored["metrics"]["dev"], task
    assert (workdir / "features/tiny/mrpc/ft1/ckpt-1/shard-1-of-2/bert_logits.npz").exists()
    assert not (workdir / "features/tiny/mrpc/ft1/ckpt-0/shard-1-of-2/bert_logits.npz").exists()
    # checkpoint 0's head has not trained: saved, not scored, no row and no ensemble there
    untrained = workdir / "models/tiny/mrpc/ft1/ckpt-0"
    assert json.loads((untrained / "train.json").read_text())["metrics"] is None
    assert not any((untrained / name).exists() for name in ("eval_metrics.json", "eval_logits.npz",
                                                            "eval_predictions.parquet"))  # fmt: skip
    assert ("mrpc", 0.0, "BERT", "accuracy") not in table.index
    lp0 = json.loads((workdir / "heads/tiny/mrpc/ft1/ckpt-0/lp/seed1/metrics.json").read_text())
    assert not lp0.get("ensembles")


def test_cost_table_adds_up_from_its_sources(workflow_run):
    workdir, _ = workflow_run
    costs = pd.read_csv(workdir / "results" / "tables" / "cost.csv")
    assert set(costs["task"]) == {"mrpc", "stsb", "squad2", "squad2-answerable", "rte", "wnli"}
    assert (costs["bertvision_s"] - (costs["finetune_s"] + costs["extract_s"] + costs["head_s"])).abs().max() < 1e-3
    row = costs[(costs["task"] == "mrpc") & (costs["checkpoint"] == 1.0) & (costs["model"] == "lp")].iloc[0]
    bert = json.loads((workdir / "models/tiny/mrpc/ft1/ckpt-1/eval_metrics.json").read_text())
    assert row["finetune_s"] == pytest.approx(bert["train_seconds"], rel=1e-4)
    manifest = json.loads((workdir / "features/tiny/mrpc/ft1/ckpt-1/manifest.json").read_text())
    assert row["feature_bytes"] == sum(sh["bytes"] for e in manifest["splits"].values() for sh in e["shards"])
    # nothing trained yet: no step, and only the session's few milliseconds between its set-up and
    # the save (12.6 ms on a loaded CI machine, over the 10 ms this once allowed)
    untrained = json.loads((workdir / "models/tiny/mrpc/ft1/ckpt-0/train.json").read_text())
    assert untrained["step"] == 0 and untrained["examples_seen"] == 0
    assert (costs[costs["checkpoint"] == 0.0]["finetune_s"] < 0.1).all()


def test_baseline_keeps_its_best_selection_epoch_and_heads_the_summary(workflow_run):
    workdir, config = workflow_run
    summary = pd.read_csv(workdir / "results/tables/summary.csv")
    for task, metric in (
        ("mrpc", "accuracy"),
        ("stsb", "pearson"),
        ("squad2", "f1"),
        ("squad2-answerable", "accuracy"),
    ):
        runs = [json.loads((workdir / f"baselines/tiny/{task}/seed{s}/metrics.json").read_text()) for s in (1, 2)]
        for run in runs:
            scores = [h["selection"][metric] for h in run["history"]]
            assert len(scores) == 2 and run["best_epoch"] == 1 + scores.index(max(scores))
            assert run["train_seconds"] == run["history"][run["best_epoch"] - 1]["train_seconds"]
        block = summary[summary["task"] == task].set_index("row")
        peers = config["tasks"][task]["peers"]
        assert list(block.index) == [
            "full fine-tuning",
            *["peer"] * len(peers),
            "BERT at a checkpoint",
            "BERTVision (picked)",
            "frozen encoder (best head)",
        ]
        full = block.loc["full fine-tuning"]
        assert full["dev_mean"] == pytest.approx(sum(r["metrics"]["dev"][metric] for r in runs) / 2, rel=1e-5)
        picked = block.loc["BERTVision (picked)"]
        # the CSV keeps 6 significant digits (SQuAD scores are on a 0-100 scale)
        assert picked["score_diff"] == pytest.approx(picked["dev_mean"] - full["dev_mean"], rel=1e-4, abs=1e-4)
        assert picked["cost_ratio"] == pytest.approx(picked["seconds"] / full["seconds"], rel=1e-4)
    md = (workdir / "results/tables/summary.md").read_text()
    # every task's verdict names the best method on selection, or that no model learned it
    verdicts = [line for line in md.splitlines() if line.startswith(("**", "The pipeline picks"))]
    assert len(verdicts) == len(config["tasks"])


def test_each_tasks_rows_are_recorded_and_their_repeats_of_train_said_in_its_summary_block(workflow_run):
    workdir, config = workflow_run
    md = (workdir / "results/tables/summary.md").read_text()
    for task in config["tasks"]:
        record = json.loads(L.rows_record(workdir / L.RAW_DIR.format(task=task)).read_text())
        assert record["rows"] == {s: len(pd.read_parquet(L.split_file(workdir / L.RAW_DIR.format(task=task), s)))
                                  for s in record["rows"]}  # fmt: skip
        block = md.split(f"\n## {task} (")[1].split("\n## ")[0]
        for split, n in record["repeated"].items():
            said = f"{n} of {record['rows'][split]} {split} rows repeat a train row's text exactly"
            assert (said in block) is (n > 0), (task, split, n)


def test_every_peer_runs_chooses_on_selection_and_is_a_summary_row(workflow_run):
    """The peers each task names (tests/conftest.py): one record per seed (the embedding's and the
    cosine's one run), the choice the best selection score among the settings tried, and a row of
    the summary, the methods table and its plot."""
    workdir, config = workflow_run
    summary = pd.read_csv(workdir / "results/tables/summary.csv")
    labels = {"embedding": "embedding + linear", "cosine": "embedding cosine", "lora": "LoRA", "bitfit": "BitFit"}
    for task, block in config["tasks"].items():
        for peer in block["peers"]:
            seeds = [0] if peer in ("embedding", "cosine") else [1, 2]
            records = [json.loads((workdir / f"peers/tiny/{task}/{peer}/seed{s}/metrics.json").read_text())
                       for s in seeds]  # fmt: skip
            for record in records:
                assert record["peer"] == peer and record["metrics"]["dev"]
                if record["tried"]:
                    best = max(record["tried"], key=lambda t: t["selection"])
                    assert record["selection_score"] == pytest.approx(best["selection"])
            row = summary[(summary["task"] == task) & (summary["row"] == "peer") & (summary["model"] == labels[peer])]
            assert len(row) == 1 and row["n"].iloc[0] == len(seeds) and row["whole_seconds"].iloc[0] > 0
    # STS-B's linear model and cosine read one encoding of the task, whose job counts whole in each
    embed_seconds = pd.read_csv(workdir / embed_job("tiny", "stsb").benchmark, sep="\t")["s"].iloc[0]
    for peer in ("embedding", "cosine"):
        assert json.loads((workdir / f"peers/tiny/stsb/{peer}/seed0/metrics.json").read_text())["shared_encoding"]
        row = summary[(summary["task"] == "stsb") & (summary["model"] == labels[peer])].iloc[0]
        assert row["whole_seconds"] > embed_seconds
    lora = json.loads((workdir / "peers/tiny/mrpc/lora/seed1/metrics.json").read_text())
    assert [t["learning_rate"] for t in lora["tried"]] == [1e-3, 1e-2] and lora["trainable_parameters"] > 0
    cosine = summary[(summary["task"] == "stsb") & (summary["model"] == "embedding cosine")].iloc[0]
    assert cosine["trainable_params"] == 0 and cosine["deterministic"]
    methods = pd.read_csv(workdir / "results/tables/methods.csv")
    assert {"peer", "full fine-tuning", "BERTVision"} <= set(methods["family"]) and methods["on_front"].any()
    md = (workdir / "results/tables/summary.md").read_text()
    assert "SetFit does not apply" not in md  # named by no task here


def test_plots_and_html_report(workflow_run, tmp_path):
    workdir, config = workflow_run
    plots = workdir / "results" / "plots"
    names = {
        *(f"{task}-score-vs-epochs.png" for task in config["tasks"]),
        "score-vs-parameters.png",
        "layer-weights.png",
        "data-fraction.png",
        "bert-curve.png",
        "score-vs-seconds.png",
        "training-loss.png",
        "cross-task.png",
        "methods-cost-score.png",
    }
    assert {p.name for p in plots.glob("*.png")} == names
    for name in names:
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = tmp_path / "report.html"
    snakemake(workdir, "--report", str(report))
    html = report.read_text(errors="replace")
    assert report.stat().st_size > 10_000
    for name in (
        "layer-weights.png",
        "score-vs-parameters.png",
        "score-vs-seconds.png",
        "training-loss.png",
        "summary.csv",
        "glue.csv",
        "squad.csv",
        "cost.csv",
        "search.csv",
        "data_fraction.csv",
        "transfer.csv",
        "bert_curve.csv",
        "cross_task.csv",
        "cross-task.png",
        "methods.csv",
        "methods-cost-score.png",
        "summary.html",
    ):
        assert name in html
    # the summary page's words, as the report embeds them (the report offers Markdown only for download)
    embedded = re.search(r'"results/tables/summary.html".*?"data_uri": "data:text/html;[^"]*?base64,([\w+/=]+)"', html)
    page = base64.b64decode(embedded.group(1)).decode()
    assert page == (workdir / "results/tables/summary.html").read_text() and "does the BERTVision path pay off?" in page


def test_token_features_feed_the_token_head_and_the_cls_heads(workflow_run):
    workdir, _ = workflow_run
    feature = {
        t: json.loads((workdir / f"features/tiny/{t}/ft1/ckpt-1/manifest.json").read_text())["feature"]
        for t in ("mrpc", "squad2-answerable", "squad2")
    }
    assert feature == {"mrpc": "tokens", "squad2-answerable": "cls", "squad2": "tokens"}
    assert not (workdir / "heads/tiny/stsb/ft1/ckpt-1/tokpool").exists()
    for checkpoint in ("0", "1"):
        run = workdir / f"heads/tiny/mrpc/ft1/ckpt-{checkpoint}/tokpool/seed1"
        record = json.loads((run / "metrics.json").read_text())
        assert record["head_spec"]["type"] == "token-pool" and len(record["layer_weights"]) == 3
        outputs = pd.read_parquet(run / "eval_predictions.parquet")["outputs"]
        assert len(outputs) == 30 and len({tuple(o) for o in outputs}) > 1  # not a constant predictor


def test_search_runs_the_combined_trials_and_tunes_the_final_heads(workflow_run):
    workdir, _ = workflow_run
    search = pd.read_csv(workdir / "results/tables/search.csv")
    assert sorted(zip(search["task"], search["checkpoint"], search["head"])) == [
        ("stsb", 0.0, "adapter8"),
        ("stsb", 1.0, "adapter8"),
    ]
    assert ((search["complete"] + search["pruned"]) == 3).all()
    for ckpt in ("0", "1"):
        study = workdir / f"search/tiny/stsb/ft1/ckpt-{ckpt}/adapter8"
        best = json.loads((study / "best.json").read_text())
        # the CSV holds 6 significant digits (reporting.markdown)
        assert search.set_index("checkpoint").loc[float(ckpt), "best_selection_score"] == pytest.approx(
            best["best_value"], rel=5e-6
        )
        workers = [json.loads(p.read_text()) for p in sorted(study.glob("worker-*.json"))]
        assert len(workers) == 2 and sorted(t["number"] for w in workers for t in w["trials"]) == [0, 1, 2]
        for seed in (1, 2):
            head = json.loads(
                (workdir / f"heads/tiny/stsb/ft1/ckpt-{ckpt}/adapter8/seed{seed}/metrics.json").read_text()
            )
            assert head["head_spec"]["width"] == best["best_params"]["width"]
            assert head["training_settings"]["learning_rate"] == pytest.approx(best["best_params"]["learning_rate"])
    glue = pd.read_csv(workdir / "results/tables/glue.csv")
    tuned = glue[glue["tuned"]]
    assert set(tuned["task"]) == {"stsb"} and set(tuned["model"]) == {"adapter8", "adapter8 + BERT (mean)"}
    assert "adapter8 †" in (workdir / "results/tables/glue.md").read_text()


def test_degenerate_runs_are_flagged_from_their_predictions(workflow_run):
    workdir, _ = workflow_run
    glue = pd.read_csv(workdir / "results/tables/glue.csv").set_index(["task", "checkpoint", "model", "metric"])
    bert = pd.read_parquet(workdir / "models/tiny/mrpc/ft1/ckpt-1/eval_predictions.parquet")
    assert glue.loc[("mrpc", 1.0, "BERT", "accuracy"), "flagged"] == int(bert["prediction"].nunique() == 1)
    for checkpoint in ("0", "1"):
        runs = [
            pd.read_parquet(workdir / f"heads/tiny/mrpc/ft1/ckpt-{checkpoint}/lp/seed{s}/eval_predictions.parquet")
            for s in (1, 2)
        ]
        constant = sum(r["prediction"].nunique() == 1 for r in runs)
        assert glue.loc[("mrpc", float(checkpoint), "lp", "accuracy"), "flagged"] == constant


def test_data_fraction_table_and_its_sources(workflow_run):
    workdir, _ = workflow_run
    table = pd.read_csv(workdir / "results/tables/data_fraction.csv")
    assert set(table["task"]) == {"stsb"} and set(table["checkpoint"]) == {1.0}
    lp = table[table["model"] == "lp"].set_index("train_fraction")
    assert sorted(lp.index) == [0.5, 1.0]
    runs = [
        json.loads((workdir / f"heads-data/tiny/stsb/ft1/ckpt-1/data-0.5/lp/seed{s}/metrics.json").read_text())
        for s in (1, 2)
    ]
    assert lp.loc[0.5, "mean"] == pytest.approx(sum(r["metrics"]["dev"]["pearson"] for r in runs) / 2, abs=1e-5)
    assert lp.loc[0.5, "train_examples"] == runs[0]["train_examples"] < lp.loc[1.0, "train_examples"]
    bert = json.loads((workdir / "models/tiny/stsb/ft1/ckpt-1/eval_metrics.json").read_text())
    assert table[table["model"] == "BERT"]["mean"].item() == pytest.approx(bert["metrics"]["dev"]["pearson"], abs=1e-5)
    assert "## stsb (tiny), 1 epochs (pearson)" in (workdir / "results/tables/data_fraction.md").read_text()


def test_transfer_diagonal_reproduces_each_heads_own_score(workflow_run):
    workdir, _ = workflow_run
    transfer = pd.read_csv(workdir / "results/tables/transfer.csv", dtype={"trained_on": str, "evaluated_on": str})
    glue = pd.read_csv(workdir / "results/tables/glue.csv").set_index(["task", "checkpoint", "model", "metric"])
    for task, metric in (("mrpc", "accuracy"), ("stsb", "pearson")):
        whole = transfer[(transfer["task"] == task) & (transfer["train_fraction"] == 1)]
        rows = whole.set_index(["model", "standardization", "trained_on", "evaluated_on"])
        for ckpt in ("0", "1"):
            for head in ("lp", "adapter8", *(("tokpool", "ladder") if task == "mrpc" else ())):
                own = glue.loc[(task, float(ckpt), head, metric), "mean"]
                # On its own checkpoint both standardizations use the head's own statistics.
                assert rows.loc[(head, "source", ckpt, ckpt), "mean"] == pytest.approx(own, abs=1e-5)
                assert rows.loc[(head, "target", ckpt, ckpt), "mean"] == pytest.approx(own, abs=1e-3)
        for how in ("source", "target"):
            assert rows.loc[("lp", how, "0", "1"), "n"] == 2 and rows.loc[("adapter8", how, "1", "0"), "n"] == 2
    assert "## stsb (tiny; pearson)" in (workdir / "results/tables/transfer.md").read_text()


def test_data_fraction_heads_are_applied_across_checkpoints(workflow_run):
    """stsb's lp trained on half the rows of checkpoint 1 (experiments.data_fraction), applied to
    checkpoint 0 too: on its own states it reproduces the data-fraction table's score."""
    workdir, _ = workflow_run
    transfer = pd.read_csv(workdir / "results/tables/transfer.csv", dtype={"trained_on": str, "evaluated_on": str})
    fraction = pd.read_csv(workdir / "results/tables/data_fraction.csv")
    half = transfer[(transfer["task"] == "stsb") & (transfer["train_fraction"] == 0.5)]
    rows = half.set_index(["model", "standardization", "trained_on", "evaluated_on"])
    own = fraction[(fraction["model"] == "lp") & (fraction["train_fraction"] == 0.5)]["mean"].item()
    assert rows.loc[("lp", "source", "1", "1"), "mean"] == pytest.approx(own, abs=1e-5)
    for how in ("source", "target"):
        assert rows.loc[("lp", how, "1", "0"), "n"] == 2
    assert set(half["trained_on"]) == {"1"} and set(half["model"]) == {"lp"}
    assert "| lp | 50% | 1 | trained on |" in (workdir / "results/tables/transfer.md").read_text()


def test_checkpoint_zero_is_the_pretrained_encoder(workflow_run, tiny_bert):
    from safetensors.torch import load_file

    workdir, _ = workflow_run
    pretrained = load_file(tiny_bert / "model.safetensors")
    ckpt0 = load_file(workdir / "models/tiny/mrpc/ft1/ckpt-0/model.safetensors")
    ckpt1 = load_file(workdir / "models/tiny/mrpc/ft1/ckpt-1/model.safetensors")
    name = "encoder.layer.0.attention.self.query.weight"
    assert (ckpt0[f"bert.{name}"] == pretrained[name]).all()
    assert not (ckpt1[f"bert.{name}"] == pretrained[name]).all()


def test_features_match_a_direct_forward_pass(workflow_run):
    import torch
    from transformers import AutoModel

    from bertvision.data.tokenized import TokenizedSplit, collate
    from bertvision.features.store import FeatureSet

    workdir, _ = workflow_run
    fs = FeatureSet.open(workdir / "features/tiny/mrpc/ft1/ckpt-1/manifest.json", "dev")
    x, _, idx = fs.read_all()
    tokens = TokenizedSplit.read(workdir / "data/tokens/tiny/mrpc/dev.parquet")
    assert (idx == tokens.idx).all()
    model = AutoModel.from_pretrained(workdir / "models/tiny/mrpc/ft1/ckpt-1").eval()
    rows = [0, 5]
    batch = collate(tokens, rows, 0)
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
    expected = torch.stack([h[:, 0] for h in states], dim=1).numpy()
    assert x.shape[1:] == expected.shape[1:]
    assert abs(x[rows].astype("float32") - expected).max() < 1e-2


def test_cross_task_table_reads_every_shared_encoder_and_reuses_the_main_pipeline(workflow_run):
    workdir, _ = workflow_run
    table = pd.read_csv(workdir / "results" / "tables" / "cross_task.csv")
    trained = table[table["role"] != "source head as is"]
    for task in ("rte", "wnli", "squad2"):
        rows = trained[trained["task"] == task].set_index("encoder")
        assert set(rows.index) == {"frozen", "rte", "wnli", "squad2", "mix"}
        assert rows.loc[task, "role"] == "own encoder" and rows.loc["frozen", "role"] == "frozen"
        assert rows.loc[task, "diff_vs_own"] == 0 and rows.loc["frozen", "diff_vs_frozen"] == 0
        # shared.heads (lp-apart reads a pair apart: not squad2's); 1 ft seed x 2 head seeds
        assert (rows["n"] == 2).all() and set(rows["head"]) <= ({"lp"} if task == "squad2" else {"lp", "lp-apart"})
    # the own-encoder and frozen cells are the main pipeline's heads, not recomputed
    cell = trained[(trained["task"] == "rte") & (trained["encoder"] == "rte")].iloc[0]
    runs = workdir / "heads/tiny/rte/ft1/ckpt-1" / cell["head"]
    own = [json.loads((runs / f"seed{s}/metrics.json").read_text()) for s in (1, 2)]
    assert cell["dev_mean"] == pytest.approx(sum(r["metrics"]["dev"]["accuracy"] for r in own) / 2, abs=1e-5)
    assert not (workdir / "shared/tiny/frozen").exists()
    assert not (workdir / "shared/tiny/rte/ft1/features/rte").exists()
    other = json.loads((workdir / "shared/tiny/rte/ft1/heads/wnli/lp/seed1/metrics.json").read_text())
    assert other["source"]["encoder"] == "rte" and other["task"] == "wnli"
    # the mixture trained one encoder on both of its tasks' rows
    record = json.loads((workdir / "shared/tiny/mix/ft1/encoder/train.json").read_text())
    assert set(record["tasks"]) == {"rte", "squad2"} and all(t["steps"] > 0 for t in record["tasks"].values())
    assert record["steps"] == sum(t["steps"] for t in record["tasks"].values())
    # RTE and WNLI share their labels: each one's heads answer the other as they are
    as_is = table[table["role"] == "source head as is"].set_index("task")
    assert as_is.loc["wnli", "encoder"] == "rte" and as_is.loc["rte", "encoder"] == "wnli"
    assert "Cross-task transfer" in (workdir / "results" / "tables" / "cross_task.md").read_text()
    assert (workdir / "results" / "plots" / "cross-task.png").stat().st_size > 0
    # the bundle `bertvision serve` loads: the mixture's encoder and each shared task's heads on it
    bundle = json.loads((workdir / "bundles/tiny/mix/bundle.json").read_text())
    assert set(bundle["tasks"]) == {"rte", "wnli", "squad2"} and bundle["keys"]["encoder"] == "mix"
    for task, entry in bundle["tasks"].items():  # shared.heads, a pair read apart beside it (not squad2's)
        assert set(entry["heads"]) == ({"lp"} if task == "squad2" else {"lp", "lp-apart"})
        assert entry["picked"] in entry["heads"]
        assert {h["pair"] for h in entry["heads"].values()} == ({"joint"} if task == "squad2" else {"joint", "apart"})
    assert bundle["tasks"]["rte"]["heads"]["lp"]["source"]["encoder"] == "mix"
    assert (workdir / "bundles/tiny/mix/encoder/model.safetensors").exists()


def test_a_head_applied_across_tasks_to_its_own_task_reproduces_its_score(workflow_run, tmp_path):
    """The head-transfer path (relabelling included) on the source task itself is the identity."""
    from bertvision.config.settings import HeadRuntimeSettings
    from bertvision.registry.tasks import get_task
    from bertvision.stages.head_transfer import apply_heads_across_tasks

    workdir, _ = workflow_run
    rte = get_task("rte")
    records = apply_heads_across_tasks(
        rte,
        rte,
        workdir / "heads/tiny/rte/ft1/ckpt-1",
        ["lp"],
        workdir / "features/tiny/rte/ft1/ckpt-1/manifest.json",
        workdir / "data/raw/rte",
        HeadRuntimeSettings(device="cpu", verify="size"),
        100.0,
        tmp_path / "head-transfer-check.json",
    )
    assert len(records) == 2
    for r in records:
        own = json.loads((workdir / f"heads/tiny/rte/ft1/ckpt-1/lp/seed{r['seed']}/metrics.json").read_text())
        assert r["metrics"]["dev"]["accuracy"] == pytest.approx(own["metrics"]["dev"]["accuracy"], abs=1e-6)


def test_a_run_in_which_nothing_fails_logs_no_error(workflow_run):
    """Snakemake's own log of the run: an error that is not one (an input function that fails
    while the DAG is built, and is then passed over) would be a newcomer's first screen."""
    workdir, _ = workflow_run
    logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    assert logs
    alarming = [line for log in logs for line in log.read_text().splitlines() if "Error" in line or "Exception" in line]
    assert alarming == []


def test_weights_are_as_readable_as_the_records_beside_them(workflow_run):
    """Every weights file (checkpoints, heads, the bundles a service loads) has the mode of the
    JSON written beside it: safetensors 0.8 writes 0o600, which a service or a colleague running
    as another user cannot read."""
    workdir, _ = workflow_run
    weights = [p for root in ("models", "heads", "bundles") for p in (workdir / root).rglob("*.safetensors")]
    assert any("bundles" in p.parts for p in weights) and any("heads" in p.parts for p in weights)
    for path in weights:
        record = next(path.parent.glob("*.json"))
        assert oct(path.stat().st_mode & 0o777) == oct(record.stat().st_mode & 0o777), (path, record)


def test_rerun_has_nothing_to_do_and_a_head_change_reruns_only_heads(workflow_run, tmp_path):
    shared, config = workflow_run
    assert "Nothing to be done" in snakemake(shared, "-n").stdout
    # the head change runs on a copy of the run, which Snakemake takes for the same finished run
    workdir = copy_workdir(shared, tmp_path / "wf")
    assert "Nothing to be done" in snakemake(workdir, "-n").stdout

    untouched = [
        *sorted((workdir / "models").rglob("model.safetensors")),
        *sorted((workdir / "features").rglob("*.h5")),
    ]
    before = {p: p.stat().st_mtime_ns for p in untouched}
    head_file = workdir / "heads/tiny/mrpc/ft1/ckpt-1/adapter8/seed1/metrics.json"
    head_before = json.loads(head_file.read_text())

    config["heads"]["models"]["adapter8"]["width"] = 4
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    counts = job_counts(snakemake(workdir, "-n").stdout)
    # mrpc, stsb, squad2-answerable, rte and wnli x 2 checkpoints; squad2 trains only lp, so the adapter change
    # leaves it alone. The stsb search of adapter8 does not rerun (its trials draw the width: the
    # search space's), but the transfer evaluations and the experiment tables do; the data-fraction
    # runs (lp only) do not.
    # The shared encoders train lp only: none of their heads reruns, but the RTE and WNLI heads
    # directories they read (the heads applied as they are, the cross-task table) are rewritten.
    # The picked bundles are written again from the new picks record.
    assert counts == {
        "serve_bundles": 1,
        "all": 1,
        "tables": 1,
        "plots": 1,
        "train_heads": 10,
        "transfer": 2,
        "experiment_tables": 1,
        "plot_data_fraction": 1,
        "plot_bert_curve": 1,
        "head_transfer": 2,
        "cross_task": 1,
    }

    snakemake(workdir)
    assert {p: p.stat().st_mtime_ns for p in untouched} == before
    head_after = json.loads(head_file.read_text())
    assert head_after["head_spec"]["width"] == 4
    assert head_after["parameters"] < head_before["parameters"]


def test_turning_on_token_features_reruns_that_tasks_extraction(workflow_run, tmp_path):
    workdir, config = workflow_run
    changed = copy.deepcopy(config)
    changed["tasks"]["squad2-answerable"]["token_features"] = True
    (tmp_path / "config-tokens.yaml").write_text(yaml.safe_dump(changed))
    counts = job_counts(snakemake(workdir, "-n", "--configfile", str(tmp_path / "config-tokens.yaml")).stdout)
    assert counts["extract"] == 4 and counts["feature_manifest"] == 2  # 2 checkpoints x 2 shards
    assert "finetune" not in counts and "tokenize" not in counts


def test_a_later_checkpoint_runs_only_its_own_jobs(workflow_run, tmp_path):
    """Adding a checkpoint after the last leaves every earlier checkpoint's fine-tuning, states and
    heads as they ran; its fine-tuning goes on from the last one, which kept no optimizer state, by
    replaying it (stages/finetune.replay)."""
    workdir = copy_workdir(workflow_run[0], tmp_path / "wf")
    config = workflow_run[1]
    config["finetune"]["epoch_fractions"] = [0, 1.0, 2.0]
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    untouched = [p for p in (workdir / "models").rglob("*") if p.is_file()]
    untouched += [p for d in ("features", "heads") for p in (workdir / d).rglob("*") if p.is_file()]
    before = {p: p.stat().st_mtime_ns for p in untouched}
    plan = snakemake(workdir, "-n").stdout
    jobs = re.findall(r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    wildcards: .*checkpoint=([0-9.]+)", plan, re.M)
    # the race decides again at the checkpoint that was the last (it may now go on); nothing else runs there
    assert {(rule, c) for rule, c in jobs if c != "2"} <= {("race_checkpoint", "1")}, jobs
    assert job_counts(plan)["finetune"] == len(list((workdir / "models").glob("tiny/*/ft*/ckpt-1")))
    # one of those jobs run for real (the rest of the plan is the same stages at another checkpoint)
    snakemake(workdir, L.CHECKPOINT_FILE.format(model="tiny", task="mrpc", ftseed=1, checkpoint="2", file="train.json"))
    assert {p: p.stat().st_mtime_ns for p in untouched} == before
    assert (
        "replaying"
        in (workdir / L.log("finetune").format(model="tiny", task="mrpc", ftseed=1, checkpoint="2")).read_text()
    )


@pytest.mark.parametrize("change", [{"settings": {"learning_rate": 5e-4}}, {"precision": "fp32"}])
def test_a_fine_tuning_change_leaves_the_untouched_encoders_jobs_alone(workflow_run, tmp_path, change):
    """Checkpoint 0 trains nothing: a new fine-tuning learning rate or precision reruns the
    fine-tuned checkpoints and full fine-tuning, never checkpoint 0's fine-tuning, states or heads
    (a new precision reran them all), nor the embeddings, computed in fp32, nor a peer fitted on
    them."""
    workdir, config = workflow_run
    changed = copy.deepcopy(config)
    for key, value in change.items():
        changed["finetune"][key] = {**changed["finetune"].get(key, {}), **value} if key == "settings" else value
    (tmp_path / "config-ft.yaml").write_text(yaml.safe_dump(changed))
    plan = snakemake(workdir, "-n", "--configfile", str(tmp_path / "config-ft.yaml")).stdout
    jobs = set(re.findall(r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    wildcards: .*checkpoint=([0-9.]+)", plan, re.M))
    assert ("finetune", "1") in jobs and job_counts(plan)["baseline"] > 0
    assert {rule for rule, c in jobs if c == "0"} <= {"race_checkpoint"}, jobs
    peers = set(re.findall(r"^(?:local)?rule peer:\n(?:    .*\n)*?    wildcards: .*peer=(\w+)", plan, re.M))
    assert "embed" not in job_counts(plan) and peers <= {"lora", "bitfit"}, peers


def test_a_new_scoring_batch_reruns_only_the_jobs_that_score_with_it(workflow_run, tmp_path):
    """finetune.settings.eval_batch_size is read by the jobs that run a model to score it (full
    fine-tuning, BERT's own scoring of a streamed task): no checkpoint is fine-tuned or extracted
    again, and a task whose BERT scores come from its extraction keeps them."""
    workdir, config = workflow_run
    changed = copy.deepcopy(config)
    changed["finetune"]["settings"]["eval_batch_size"] = 7
    (tmp_path / "config-eval.yaml").write_text(yaml.safe_dump(changed))
    plan = snakemake(workdir, "-n", "--configfile", str(tmp_path / "config-eval.yaml")).stdout
    counts = job_counts(plan)
    assert counts["baseline"] > 0 and counts["score_bert"] > 0, counts
    assert not {"finetune", "extract", "feature_manifest", "tokenize"} & set(counts), counts
    scored = re.findall(r"^(?:local)?rule score_bert:\n(?:    .*\n)*?    wildcards: .*task=(\w+)", plan, re.M)
    assert set(scored) == {"stsb"}, scored  # the streamed task; mrpc's come from its extraction


def test_a_new_extraction_batch_reruns_no_extraction(workflow_run, tmp_path):
    """extract.batch_size and its blocks bound the extraction's memory, as micro-batches do: the
    states extracted stay; only a streamed task's heads, which compute their states in their own
    jobs with that batch, run again."""
    workdir, config = workflow_run
    changed = copy.deepcopy(config)
    changed.setdefault("extract", {}).update(batch_size=5, block_rows=100)
    (tmp_path / "config-batch.yaml").write_text(yaml.safe_dump(changed))
    plan = snakemake(workdir, "-n", "--configfile", str(tmp_path / "config-batch.yaml")).stdout
    counts = job_counts(plan)
    assert not {"extract", "feature_manifest", "score_bert", "finetune"} & set(counts), counts
    heads = re.findall(r"^(?:local)?rule train_heads\w*:\n(?:    .*\n)*?    wildcards: .*task=(\w+)", plan, re.M)
    assert heads and set(heads) == {"stsb"}, heads


def test_a_streamed_task_stores_no_features_and_its_heads_match_the_tables(workflow_run, tmp_path):
    workdir, config = workflow_run
    assert not (workdir / "features/tiny/stsb").exists()  # no extract or manifest job ran for it
    assert (workdir / "features/tiny/mrpc").exists()
    for checkpoint in ("0", "1"):
        for head in ("lp", "adapter8"):
            record = json.loads(
                (workdir / f"heads/tiny/stsb/ft1/ckpt-{checkpoint}/{head}/seed1/metrics.json").read_text()
            )
            assert record["features_stored"] is False and record["stream"]["runs_per_pass"] == 4
            assert record["search"] is not None or head == "lp"  # the search's best parameters, streamed too
    costs = pd.read_csv(workdir / "results" / "tables" / "cost.csv")
    stsb = costs[costs["task"] == "stsb"]
    assert set(stsb["features"]) == {"streamed"} and (stsb["feature_bytes"] == 0).all()
    assert (stsb["extract_s"] == 0).all() and stsb["bertvision_s"].notna().all()
    assert set(costs[costs["task"] == "mrpc"]["features"]) == {"stored"}
    subset = json.loads((workdir / "heads-data/tiny/stsb/ft1/ckpt-1/data-0.5/lp/seed1/metrics.json").read_text())
    assert subset["features_stored"] is False and subset["train_fraction"] == 0.5
    transfer = json.loads((workdir / L.TRANSFER_FILE.format(model="tiny", task="stsb", ftseed=1)).read_text())
    assert {r["evaluated_on"] for r in transfer["records"]} == {"0", "1"}
    # turning storage back on adds exactly its extraction and reruns its heads' consumers
    changed = copy.deepcopy(config)
    changed["tasks"]["stsb"]["store"] = True
    (tmp_path / "config-stored.yaml").write_text(yaml.safe_dump(changed))
    counts = job_counts(snakemake(workdir, "-n", "--configfile", str(tmp_path / "config-stored.yaml")).stdout)
    assert counts["extract"] == 4 and counts["feature_manifest"] == 2
    assert "finetune" not in counts and "tokenize" not in counts


@pytest.mark.parametrize("config", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_plan_the_full_dag(tmp_path, config):
    """The configs in configs/ (paper scale: hub and GPUs; CPU scale: hours) cannot run here but
    must validate and plan every job, run from a directory that has the shipped resources/."""
    (tmp_path / "config.yaml").write_text(config.read_text())
    (tmp_path / "resources").symlink_to(REPO / "resources")
    from bertvision.config.schema import validate_config

    spec = validate_config(yaml.safe_load(config.read_text()), source=config.name)  # defaults filled in
    n_tasks, n_seeds = len(spec["tasks"]), len(spec["finetune"]["seeds"])
    n_ckpts = len(spec["finetune"]["epoch_fractions"])
    # checkpoint 0, the untouched encoder, is extracted and its heads trained once for every seed
    untouched = 0 in spec["finetune"]["epoch_fractions"]
    n_runs = n_seeds * n_ckpts - (n_seeds - 1) * untouched
    if spec["heads"]["race"]["protocol"] == "racing":
        # the race plans each task's first checkpoint and its decision; the rest waits on them
        racing = job_counts(snakemake(tmp_path, "-n", timeout=300).stdout)
        assert racing["race_checkpoint"] == n_tasks * len(spec["backbones"])
    # every job the config can run: the same config under the grid
    grid = REPO / "configs/overlays/grid.yaml"
    out = snakemake(tmp_path, "-n", "--configfile", str(tmp_path / "config.yaml"), str(grid), timeout=300).stdout
    counts = job_counts(out)
    assert "race_checkpoint" not in counts
    assert counts["download"] == n_tasks
    assert counts["finetune"] == n_tasks * n_seeds * n_ckpts
    # BERT is scored at every checkpoint but 0 (the pretrained encoder: its head has not trained)
    n_scored = sum(1 for f in spec["finetune"]["epoch_fractions"] if f > 0)
    assert counts.get("score_bert", 0) == n_tasks * n_seeds * n_scored
    baseline = spec["baseline"]
    n_baselines = len(baseline["seeds"]) if baseline["enabled"] else 0
    assert counts.get("baseline", 0) == n_tasks * n_baselines
    store = spec["extract"]["store"]
    n_stored = sum(1 for over in spec["tasks"].values() if (over or {}).get("store", store))
    assert counts.get("extract", 0) == n_stored * n_runs * spec["extract"]["shards"]
    assert counts["train_heads"] == n_tasks * n_runs
    n_searched = sum(len(t.get("search_heads", [])) for t in spec["tasks"].values())
    assert counts.get("search_worker", 0) == n_searched * n_runs * spec["search"]["workers"]
    assert counts.get("search_best", 0) == n_searched * n_runs
    experiments = spec["experiments"]
    assert counts.get("transfer", 0) == len(experiments["transfer"]["tasks"]) * n_seeds
    curve = experiments["bert_curve"]
    n_curves = len(curve["tasks"]) * len(curve["seeds"]) * len(spec["backbones"])
    assert counts.get("bert_curve", 0) == n_curves
    data_fraction = experiments["data_fraction"]
    predicted = [t for t, over in spec["tasks"].items() if "test" in ((over or {}).get("files") or {})]
    assert counts.get("predict", 0) == len(predicted) * len(spec["backbones"])
    subset_checkpoints = data_fraction["checkpoints"] or []
    subset_runs = n_seeds * len(subset_checkpoints) - (n_seeds - 1) * (0 in subset_checkpoints)
    assert counts.get("train_heads_subset", 0) == (
        len(data_fraction["tasks"]) * subset_runs * len(data_fraction.get("fractions", []))
    )


def test_the_default_runs_from_a_working_directory_of_its_own(tmp_path):
    """snakemake --directory elsewhere (outputs out of the clone): the shipped data are found from
    the project, not the working directory, and the download reads them (it failed to plan); their
    place is no setting (null in the jobs' settings), so a moved checkout reruns nothing (it reran all)."""
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    out = snakemake(tmp_path, "-n", "-p", "--until", "download", timeout=300).stdout
    assert job_counts(out)["download"] == 2
    assert re.findall(r'"glue_dir": ([^,]+),', out) == ["null", "null"]
    assert str(REPO / "resources" / "glue" / "SST-2" / "train.tsv") in out  # the rule's input: a new file reruns it


def test_run_tasks_plans_one_task_of_a_config(tmp_path):
    """`--config run_tasks=[mrpc]` beside cpu-glue.yaml plans MRPC's jobs alone, with its
    settings: the way to run a big config a task at a time."""
    grid = REPO / "configs/overlays/grid.yaml"
    args = ("-n", "--configfile", str(REPO / "configs/cpu-glue.yaml"), str(grid), "--config", "run_tasks=[mrpc]")
    out = snakemake(tmp_path, *args, timeout=300).stdout
    counts = job_counts(out)
    # 2 fine-tuning seeds x checkpoints 0, 0.3 and 1, checkpoint 0 once; 3 full fine-tuning seeds
    assert counts["download"] == 1 and counts["finetune"] == 6 and counts["train_heads"] == 5
    assert counts["baseline"] == 3 and counts["extract"] == 5
    assert "task=mrpc" in out
    assert "task=cola" not in out and "task=rte" not in out and "task=stsb" not in out


def test_model_jobs_record_the_precision_auto_picks_here_and_fork_from_the_warm_pool(workflow_run):
    """precision auto everywhere (the tiny config sets none): every encoder stage's records,
    the timing table and the summary say what auto resolves to on this CPU; and the model jobs
    of the local run were forked from the warm pool instead of importing torch anew (a job that
    starts before the pool has finished its imports runs on its own: at most the first two)."""
    import torch

    from bertvision.runtime.device import resolve_precision

    workdir, config = workflow_run
    # the flag rule; where the CPU lists native bf16, each job measures its encoder's shape instead
    flag_rule = resolve_precision(torch.device("cpu"), "auto")
    timing = pd.read_csv(workdir / "results" / "tables" / "timing.csv").fillna("")
    encoder_stages = timing[timing["stage"].isin(["finetune", "baseline", "extract"])]
    assert set(encoder_stages["stage"]) == {"finetune", "baseline", "extract"}
    recorded = set(encoder_stages["precision"])
    # head jobs run the encoder only for a streamed task; on stored states the column is empty
    streamed = [t for t, spec in config["tasks"].items() if spec.get("store") is False]
    heads = timing[timing["stage"] == "train_heads"]
    streamed_precisions = set(heads[heads["task"].isin(streamed)]["precision"])
    assert streamed and set(heads[~heads["task"].isin(streamed)]["precision"]) == {""}
    summary = (workdir / "results" / "tables" / "summary.md").read_text()
    if flag_rule == "fp32":
        assert recorded == streamed_precisions == {"fp32 on cpu"}
        assert "Devices and precision: full fine-tuning on cpu fp32" in summary
    else:  # measured per job (its thread count is part of the shape measured)
        assert recorded | streamed_precisions <= {"fp32 on cpu", "bf16 on cpu"}
    model_logs = [p for rule in ("finetune", "baseline", "extract") for p in (workdir / "logs" / rule).rglob("*.log")]
    assert len(model_logs) >= 6
    unforked = [p for p in model_logs if "forked from the warm pool" not in p.read_text()]
    assert len(unforked) <= 2, unforked


def test_the_picked_bundles_serve_every_task_of_the_run_over_http(workflow_run):
    """bundles/tiny/picked: the summary's pick for every task (the tasks picked on the untouched
    encoder share the frozen bundle), served as one service; each task asked over HTTP answers
    with its picked head."""
    import httpx
    from safetensors.torch import load_file

    from bertvision.serving.app import ServeSettings, create_app
    from tests.http_server import Server

    workdir, config = workflow_run
    picked_dir = workdir / L.PICKED_BUNDLES_DIR.format(model="tiny")
    index = json.loads((picked_dir / L.BUNDLE_SET_INDEX).read_text())
    assert set(index["picks"]) == set(config["tasks"])
    summary = pd.read_csv(workdir / "results/tables/summary.csv")
    picked = summary[summary["row"] == "BERTVision (picked)"].set_index("task")
    for task, pick in index["picks"].items():
        assert (
            pick["model"] == picked.loc[task, "model"] and float(pick["checkpoint"]) == picked.loc[task, "checkpoint"]
        )
        bundle = json.loads((picked_dir / pick["bundle"] / "bundle.json").read_text())
        assert bundle["tasks"][task]["picked"] == pick["model"]  # an ensemble too, served as evaluated
        if pick["checkpoint"] == "0" and pick["model"] == pick["head"]:
            assert pick["bundle"] == "frozen"
        else:  # a task's own checkpoint, or an ensemble (its bundle keeps the task's whole model)
            checkpoint = pick["checkpoint"]
            assert pick["bundle"] == f"{task}-ft{pick['ft_seed']}-ckpt-{checkpoint}"
            assert list(bundle["tasks"]) == [task]
            ckpt = load_file(workdir / f"models/tiny/{task}/ft{pick['ft_seed']}/ckpt-{checkpoint}/model.safetensors")
            served = load_file(picked_dir / pick["bundle"] / "encoder/model.safetensors")
            name = "embeddings.word_embeddings.weight"
            kept = name if name in served else f"bert.{name}"  # (an ensemble's bundle keeps the whole model)
            assert (served[kept] == ckpt[f"bert.{name}"]).all()  # the task's own encoder at that checkpoint
    assert set(index["bundles"]) == {p["bundle"] for p in index["picks"].values()}

    pair = ["A man is playing a guitar.", "A man plays the guitar."]
    question = {"question": "Who plays?", "context": "A man plays the guitar in the park."}
    with Server(create_app(picked_dir, ServeSettings(device="cpu"))) as running:
        client = httpx.Client(base_url=running.url, timeout=60)
        tasks = client.get("/tasks").json()
        assert set(tasks["tasks"]) == set(config["tasks"]) and len(tasks["encoders"]) == len(index["bundles"])
        for task, pick in index["picks"].items():
            kind = tasks["tasks"][task]
            body = {"qa": [question]} if task.startswith("squad2") else {"texts": [pair]}
            response = client.post("/predict", json={**body, "tasks": [task]})
            assert response.status_code == 200, (task, response.text)
            answer = response.json()["answers" if "qa" in body else "predictions"][0][task]
            assert answer["head"] == pick["model"] == kind["picked"]
            v2 = client.get(f"/v2/models/{task}/ready")
            assert v2.status_code == 200
