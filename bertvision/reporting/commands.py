"""The reporting commands of the ``bertvision`` command line: the result and experiment tables,
the plots and the cross-task table (rules tables, experiment_tables, plots, plot_data_fraction,
cross_task); each reads finished records, never trains."""

from __future__ import annotations

from pathlib import Path


def cmd_cross_task(a):
    from bertvision.stages.cross_task import build_cross_task

    build_cross_task(a.encoders, a.models, a.ft_seeds, a.heads, a.epochs, a.transfer, a.out_dir, a.plot)


def cmd_tables(a):
    from bertvision.layout import Run
    from bertvision.stages.tables import build_tables

    runs = [Run(**keys) for keys in a.runs]
    build_tables(a.bert_metrics, a.head_dirs, a.manifests, runs, a.shards, a.heads, a.out_dir, a.baseline_metrics,
                 a.search_workers)  # fmt: skip


def cmd_experiment_tables(a):
    from bertvision.stages.experiment_tables import build_experiment_tables

    build_experiment_tables(a.search, a.subset_dirs, a.head_dirs, a.bert_metrics, a.transfer, a.out_dir)


def cmd_plots(a):
    from bertvision.layout import head_metrics_files
    from bertvision.reporting.plots import build_plots

    build_plots(a.tables, head_metrics_files(a.head_dirs), a.tasks, a.out_dir, a.summary)


def cmd_plot_data_fraction(a):
    from bertvision.reporting.plots import data_fraction_curves

    data_fraction_curves(a.table, a.out)


def add_reporting_commands(sub, subcommand, json_arg) -> None:
    """Register the reporting subcommands on ``sub`` (``subcommand``: the CLI's parser factory,
    ``json_arg``: its JSON argument type)."""
    s = subcommand(sub, "cross-task", cmd_cross_task, "the cross-task transfer table and heatmap (rule cross_task)")
    s.add_argument("--encoders", type=json_arg, required=True, help="the shared encoders, [{name, kind, ...}, ...]")
    s.add_argument("--models", nargs="+", required=True)
    s.add_argument("--ft-seeds", type=int, nargs="+", required=True)
    s.add_argument("--heads", type=json_arg, required=True, help='{"task": [head names], ...}')
    s.add_argument("--epochs", type=json_arg, required=True, help='{"mixture": epochs, ...}')
    s.add_argument("--transfer", type=Path, nargs="*", default=[], help="head_transfer records")
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--plot", type=Path, required=True)

    s = subcommand(sub, "tables", cmd_tables, "summary, result, cost and timing tables (rule tables)")
    s.add_argument("--bert-metrics", type=Path, nargs="*", default=[])
    s.add_argument("--baseline-metrics", type=Path, nargs="*", default=[], help="full fine-tuning records (summary)")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[], help="train_heads output directories")
    s.add_argument("--manifests", type=Path, nargs="*", default=[], help="feature manifests (cost table)")
    s.add_argument(
        "--search-workers", type=Path, nargs="*", default=[], help="search worker records (the whole cost of a pick)"
    )
    s.add_argument(
        "--runs",
        type=json_arg,
        required=True,
        help="every run, [{model, task, ftseed, frac}, ...]: their jobs' benchmark files give the times",
    )
    s.add_argument("--shards", type=int, required=True, help="extraction shards per checkpoint")
    s.add_argument("--heads", nargs="*", default=[], help="head names in table order")
    s.add_argument("--out-dir", type=Path, required=True)

    s = subcommand(
        sub,
        "experiment-tables",
        cmd_experiment_tables,
        "search, data-fraction and transfer tables (rule experiment_tables)",
    )
    s.add_argument("--search", type=Path, nargs="*", default=[], help="best.json of every study")
    s.add_argument("--subset-dirs", type=Path, nargs="*", default=[], help="train_heads_subset outputs")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[], help="train_heads outputs (the full data)")
    s.add_argument("--bert-metrics", type=Path, nargs="*", default=[])
    s.add_argument("--transfer", type=Path, nargs="*", default=[], help="transfer records")
    s.add_argument("--out-dir", type=Path, required=True)

    s = subcommand(sub, "plots", cmd_plots, "PNG plots from the result tables and head metrics (rule plots)")
    s.add_argument("--tables", type=Path, nargs="+", required=True, help="glue.csv / squad.csv")
    s.add_argument("--summary", type=Path, help="summary.csv (the score-vs-seconds plot)")
    s.add_argument("--head-dirs", type=Path, nargs="*", default=[])
    s.add_argument("--tasks", nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)

    s = subcommand(
        sub, "plot-data-fraction", cmd_plot_data_fraction, "score vs share of training data (rule plot_data_fraction)"
    )
    s.add_argument("--table", type=Path, required=True, help="data_fraction.csv")
    s.add_argument("--out", type=Path, required=True)
