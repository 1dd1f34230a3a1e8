"""The head commands of the ``bertvision`` command line: ``train-heads`` (rules train_heads,
train_heads_subset), ``transfer`` and ``head-transfer`` (heads applied to other checkpoints or
tasks), and the search's ``search-worker`` and ``search-best``."""

from __future__ import annotations

from pathlib import Path

from bertvision.arguments import json_arg, name_path_arg, settings_arg, subcommand, task_arg
from bertvision.config import settings as typed
from bertvision.features.source import feature_source


def cmd_train_heads(a):
    from bertvision.stages.train_heads import train_heads

    train_heads(
        task_arg(a.task),
        a.heads,
        typed.HeadTrainingSettings.from_json(a.settings),
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        a.manifest,
        a.seeds,
        a.out_dir,
        a.threads,
        a.raw_dir,
        a.bert_logits,
        dict(a.searched),
        a.train_fraction,
    )


def cmd_head_transfer(a):
    from bertvision.stages.head_transfer import apply_heads_across_tasks

    settings = typed.HeadTrainingSettings.from_json(a.settings)
    apply_heads_across_tasks(
        task_arg(a.source_task, "--source-task"),
        task_arg(a.task),
        a.head_dir,
        a.heads,
        a.manifest,
        a.raw_dir,
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        settings.in_memory_max_mb,
        a.out,
        a.threads,
    )


def cmd_transfer(a):
    from bertvision.stages.transfer import transfer

    settings = typed.HeadTrainingSettings.from_json(a.settings)
    transfer(
        task_arg(a.task),
        a.head_dirs,
        a.manifests,
        a.raw_dir,
        a.out,
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        settings.in_memory_max_mb,
        a.threads,
    )


def cmd_search_worker(a):
    from bertvision.stages.search import run_worker

    run_worker(
        task_arg(a.task),
        a.study,
        a.spec,
        typed.HeadTrainingSettings.from_json(a.settings),
        typed.HeadRuntimeSettings.from_json(a.runtime, "--runtime"),
        typed.SearchSettings.from_json(a.search, "--search"),
        a.manifest,
        a.raw_dir,
        a.storage,
        a.worker,
        a.out,
        a.threads,
    )


def cmd_search_best(a):
    from bertvision.stages.search import summarize_study

    summarize_study(a.workers, a.out)


def _applied_heads_args(s, raw_dir_help: str) -> None:
    """The arguments of the commands that apply trained heads to other features (transfer,
    head-transfer): the raw splits, the head settings, the output and the threads."""
    s.add_argument("--raw-dir", type=Path, required=True, help=raw_dir_help)
    settings_arg(s, "--settings", typed.HeadTrainingSettings)
    settings_arg(s, "--runtime", typed.HeadRuntimeSettings)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)


def _features_arg(s) -> None:
    s.add_argument(
        "--manifest",
        type=feature_source,
        required=True,
        metavar="MANIFEST|SOURCE_JSON",
        help="the feature manifest, or a stream source (JSON) for store: false",
    )


def add_head_commands(sub) -> None:
    """Add ``train-heads``, ``transfer``, ``head-transfer``, ``search-worker`` and ``search-best``
    to the subparsers ``sub``."""
    s = subcommand(
        sub,
        "train-heads",
        cmd_train_heads,
        "train every head on one checkpoint's features, per seed (rules train_heads, train_heads_subset)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--heads", type=json_arg, required=True, help='{"name": {"type": ..., options}, ...}')
    settings_arg(s, "--settings", typed.HeadTrainingSettings)
    settings_arg(s, "--runtime", typed.HeadRuntimeSettings)
    _features_arg(s)
    s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
    s.add_argument(
        "--bert-logits",
        type=Path,
        nargs="?",
        help="BERT's eval_logits.npz at this checkpoint (ensembles; none on a shared encoder)",
    )
    s.add_argument("--seeds", type=int, nargs="+", required=True)
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument(
        "--searched",
        type=name_path_arg,
        nargs="*",
        default=[],
        help="HEAD=best.json: train HEAD with its search's best parameters",
    )
    s.add_argument("--train-fraction", type=float, default=1.0, help="train on this nested share of the rows")
    s.add_argument("--threads", type=int)

    s = subcommand(
        sub,
        "transfer",
        cmd_transfer,
        "evaluate heads trained on one checkpoint on every checkpoint's features (rule transfer)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--head-dirs", type=Path, nargs="+", required=True, help="train_heads outputs, one per checkpoint")
    s.add_argument(
        "--manifests",
        type=feature_source,
        nargs="+",
        required=True,
        help="feature manifests (or stream sources as JSON) of the checkpoints",
    )
    _applied_heads_args(s, "the task's canonical splits")

    s = subcommand(
        sub,
        "head-transfer",
        cmd_head_transfer,
        "a task's heads applied as they are to a task with the same labels (rule head_transfer)",
    )
    s.add_argument("--source-task", required=True)
    s.add_argument("--task", required=True, help="the target task")
    s.add_argument("--head-dir", type=Path, required=True, help="the source task's train_heads output")
    s.add_argument("--heads", nargs="+", required=True, help="head names to apply")
    s.add_argument("--manifest", type=Path, required=True, help="the target's features of the source's encoder")
    _applied_heads_args(s, "the target task's canonical splits")

    s = subcommand(
        sub,
        "search-worker",
        cmd_search_worker,
        "run one worker's share of an optuna study of a head (rule search_worker)",
    )
    s.add_argument("--task", required=True)
    s.add_argument("--study", type=json_arg, required=True, help="the study's keys: model, task, ftseed, frac, head")
    s.add_argument("--spec", type=json_arg, required=True, help="the head's configured architecture")
    settings_arg(s, "--settings", typed.HeadTrainingSettings)
    settings_arg(s, "--runtime", typed.HeadRuntimeSettings)
    settings_arg(s, "--search", typed.SearchSettings)
    _features_arg(s)
    s.add_argument("--raw-dir", type=Path, required=True)
    s.add_argument("--storage", required=True, help="journal file path or RDB URL")
    s.add_argument("--worker", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--threads", type=int)

    s = subcommand(
        sub, "search-best", cmd_search_best, "a finished study's best parameters and trial counts (rule search_best)"
    )
    s.add_argument("--workers", type=Path, nargs="+", required=True, help="the study's worker records")
    s.add_argument("--out", type=Path, required=True)
