"""The plots people read: panels in a grid of at most three per row, log axes whose ticks
carry labels even where the values span less than a decade, and training-loss curves drawn from
the heads' own histories."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402

from bertvision.reporting import figures, plots  # noqa: E402
from bertvision.reporting.summary import FULL_FT, ROW_KINDS  # noqa: E402


def summary_csv(path, tasks, seconds):
    rows = []
    for task in tasks:
        for row, second, score in zip((FULL_FT, ROW_KINDS[2], ROW_KINDS[4]), seconds, (0.8, 0.78, 0.7)):
            rows.append({"backbone": "m", "task": task, "row": row, "model": "lp", "metric": "accuracy",
                         "checkpoint": np.nan if row == FULL_FT else 1.0, "dev_mean": score, "dev_std": 0.01,
                         "seconds": second, "seconds_std": 1.0})  # fmt: skip
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_six_tasks_make_a_grid_not_one_long_row(tmp_path):
    tasks = ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]
    out = tmp_path / "score-vs-seconds.png"
    plots.score_vs_seconds(summary_csv(tmp_path / "s.csv", tasks, (300.0, 120.0, 40.0)), out)
    width, height = Image.open(out).size
    assert width <= figures.PANELS_PER_ROW * 4.2 * 120 + 10 and height >= 2 * 4 * 120 - 10


def test_a_log_axis_narrower_than_a_decade_has_labelled_ticks():
    fig, ax = plt.subplots()
    values = [31.0, 38.0, 45.0]  # no power of ten inside: matplotlib's default labels nothing here
    ax.scatter(values, [1, 2, 3])
    ax.set_xscale("log")
    figures.log_axis(ax.xaxis, values)
    fig.canvas.draw()
    low, high = ax.get_xlim()
    labelled = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
    assert len(labelled) >= 2, labelled
    plt.close(fig)


def trained_heads(root, max_epochs=3):
    """Real head records: LP and AP, two head seeds, trained on planted features (checkpoint 1,
    fine-tuning seed 1) in a heads directory laid out as the workflow's."""
    from bertvision.registry.tasks import get_task
    from bertvision.stages.train_heads import train_heads
    from tests.stages import with_training
    from tests.test_train_head import HEADS, RUNTIME, SETTINGS, planted_features

    heads_dir = root / "heads" / "m" / "sst2" / "ft1" / "ckpt-1"
    settings = SETTINGS.replace(max_epochs=max_epochs, patience=max_epochs)
    manifest = planted_features(root / "features", n_shards=1)
    heads = {name: HEADS[name] for name in ("lp", "ap")}
    train_heads(get_task("sst2"), with_training(heads, settings), RUNTIME, manifest, [1, 2], heads_dir, threads=1)
    return heads_dir


def frozen_copies(heads_dir, root):
    """The records of ``heads_dir`` as if trained on the untouched encoder of fine-tuning seeds 1
    and 2: the same states for both, so copies that must count once."""
    dirs = []
    for ft_seed in (1, 2):
        out = root / "heads" / "m" / "sst2" / f"ft{ft_seed}" / "ckpt-0"
        for metrics in heads_dir.glob("*/seed*/metrics.json"):
            record = json.loads(metrics.read_text())
            record["source"] = {**record["source"], "checkpoint": "0", "ft_seed": ft_seed}
            target = out / metrics.relative_to(heads_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(record))
        dirs.append(out)
    return dirs


def baseline_record(path, seed, losses):
    """A full fine-tuning record with the fields the baseline stage writes in its history."""
    history = [
        {
            "epoch": e,
            "step": 10 * e,
            "train_seconds": 5.0 * e,
            "train_loss_recent": loss,
            "selection": {"accuracy": 0.7},
        }
        for e, loss in enumerate(losses, start=1)
    ]
    record = {"task": "sst2", "model": "m", "epochs": len(losses), "best_epoch": 1, "history": history, "seed": seed}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_training_loss_curves_are_the_heads_histories(tmp_path, monkeypatch):
    from bertvision.layout import head_metrics_files

    heads_dir = trained_heads(tmp_path)
    frozen = frozen_copies(heads_dir, tmp_path)
    baselines = [
        baseline_record(tmp_path / "baselines" / f"seed{s}.json", s, losses)
        for s, losses in ((1, [0.6, 0.4, 0.2]), (2, [0.5, 0.3, 0.1]))
    ]
    records = {}  # (head, seed) -> the trained record
    for metrics in heads_dir.glob("*/seed*/metrics.json"):
        record = json.loads(metrics.read_text())
        records[record["head"], record["seed"]] = record
    assert len(records) == 4 and all(len(r["history"]) == 3 for r in records.values())

    drawn = {}  # what the figure holds when it is saved: each panel's lines

    def keep_lines(fig, path):
        drawn["panels"] = [
            {"title": ax.get_title(), "lines": [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines]}
            for ax in fig.axes
            if ax.get_visible()
        ]
        return save(fig, path)

    save = plots.save
    monkeypatch.setattr(plots, "save", keep_lines)
    out = tmp_path / "plots" / "training-loss.png"
    frame = plots.training_loss(head_metrics_files([heads_dir, *frozen]), out, baselines, tasks=["sst2"])

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for head in ("lp", "ap"):
        want = np.mean([[h["train_loss"] for h in records[head, s]["history"]] for s in (1, 2)], axis=0)
        for checkpoint in (1.0, 0.0):  # the untouched encoder's copies count once: n is 2, not 4
            got = frame[(frame["model"] == head) & (frame["checkpoint"] == checkpoint)]
            assert list(got["epoch"]) == [1, 2, 3] and list(got["n"]) == [2, 2, 2]
            np.testing.assert_allclose(got["train_loss"], want, rtol=1e-12)
    full = frame[frame["model"] == FULL_FT]
    assert full["checkpoint"].isna().all() and list(full["n"]) == [2, 2, 2]
    np.testing.assert_allclose(full["train_loss"], [0.55, 0.35, 0.15])
    # the panel draws exactly the frame's curves: four head lines and full fine-tuning
    (panel,) = drawn["panels"]
    assert panel["title"] == "sst2"
    curves = sorted(
        (tuple(g["epoch"]), tuple(g["train_loss"])) for _, g in frame.groupby(["model", "checkpoint"], dropna=False)
    )
    lines = sorted((tuple(x), tuple(y)) for x, y in panel["lines"])
    assert len(lines) == 5
    for (x_want, y_want), (x_got, y_got) in zip(curves, lines):
        assert x_got == x_want
        np.testing.assert_allclose(y_got, y_want)


def test_the_plots_command_writes_the_training_loss_plot(tmp_path):
    """``bertvision plots`` with the flags the plots rule passes: the training-loss plot from
    the heads' directories and the baselines' records, one panel per task in a grid."""
    from bertvision.commands.main import main

    heads_dir = trained_heads(tmp_path, max_epochs=2)
    baseline = baseline_record(tmp_path / "baselines" / "seed1.json", 1, [0.6, 0.3])
    glue = tmp_path / "glue.csv"
    pd.DataFrame(
        [
            {"backbone": "m", "task": "sst2", "split": "dev", "checkpoint": 1.0, "model": model,
             "metric": "accuracy", "mean": score, "std": 0.01, "parameter_percent": percent, "ensemble": False}
            for model, score, percent in (("BERT", 0.8, 100.0), ("lp", 0.75, 0.1))
        ]
    ).to_csv(glue, index=False)  # fmt: skip
    (tmp_path / "squad.csv").write_text("")
    out_dir = tmp_path / "plots"
    argv = ["plots", "--result-csvs", str(glue), str(tmp_path / "squad.csv"), "--head-dirs", str(heads_dir)]
    argv += ["--baseline-metrics", str(baseline), "--tasks", "sst2", "--out-dir", str(out_dir)]
    assert main(argv) == 0
    png = out_dir / "training-loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = Image.open(png).size
    assert width <= 4.5 * 120 + 10 and height <= 4 * 120 + 10  # one task: one panel


def test_the_data_fraction_plot_draws_a_panel_per_task_and_checkpoint_and_says_when_none_ran(tmp_path):
    from bertvision.reporting.experiment_plots import data_fraction_curves

    rows = [
        {"backbone": "tiny", "task": task, "checkpoint": 0.3, "model": model, "train_fraction": fraction,
         "mean": 0.6 + fraction / 10, "std": 0.01, "metric": "accuracy"}
        for task in ("sst2", "mrpc") for model in ("lp", "BERT") for fraction in (0.1, 0.3)
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "data_fraction.csv", index=False)
    drawn = tmp_path / "data-fraction.png"
    data_fraction_curves(tmp_path / "data_fraction.csv", drawn)
    width, _ = Image.open(drawn).size
    assert width >= 2 * 4.5 * 120 - 10  # two panels side by side
    (tmp_path / "none.csv").write_text("")
    data_fraction_curves(tmp_path / "none.csv", tmp_path / "none.png")
    assert (tmp_path / "none.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
