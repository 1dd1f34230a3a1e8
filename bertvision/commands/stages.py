"""The function each command runs, imported only when that command runs: importing every stage
(torch, transformers, optuna, matplotlib) takes about 10 s against 0.3 s for the command layer
alone, and most commands need a few of them. Written as import statements, so that a reader and
an import drawing follow every command to its stage."""

from __future__ import annotations

from collections.abc import Callable


def stage_of(command: str) -> Callable:
    """The stage function behind ``command`` (a name of ``commands.main.COMMANDS``)."""
    match command:
        case "validate-config":
            from bertvision.config.workflow import validate_config_file as stage
        case "clean":
            from bertvision.layout import clean as stage
        case "download":
            from bertvision.stages.download import download_task as stage
        case "tokenize":
            from bertvision.stages.tokenize import tokenize_task as stage
        case "finetune":
            from bertvision.stages.finetune import finetune as stage
        case "score-bert":
            from bertvision.stages.score_bert import score_bert as stage
        case "baseline":
            from bertvision.stages.baseline import full_finetune as stage
        case "embed":
            from bertvision.stages.peer import embed_task as stage
        case "peer":
            from bertvision.stages.peer import run_peer as stage
        case "bert-curve":
            from bertvision.stages.bert_curve import bert_curve as stage
        case "finetune-mixture":
            from bertvision.stages.finetune_mixture import finetune_mixture as stage
        case "extract":
            from bertvision.stages.extract import extract_shard as stage
        case "manifest":
            from bertvision.features.store import write_manifest as stage
        case "train-heads":
            from bertvision.stages.train_heads import train_heads as stage
        case "race-checkpoint":
            from bertvision.stages.race import decide_checkpoint as stage
        case "transfer":
            from bertvision.stages.transfer import transfer as stage
        case "head-transfer":
            from bertvision.stages.head_transfer import apply_heads_across_tasks as stage
        case "search-worker":
            from bertvision.stages.search import run_worker as stage
        case "search-best":
            from bertvision.stages.search import summarize_study as stage
        case "tables":
            from bertvision.stages.tables import build_tables as stage
        case "experiment-tables":
            from bertvision.stages.experiment_tables import build_experiment_tables as stage
        case "plots":
            from bertvision.reporting.plots import build_plots as stage
        case "plot-data-fraction":
            from bertvision.reporting.experiment_plots import data_fraction_curves as stage
        case "plot-bert-curve":
            from bertvision.reporting.experiment_plots import bert_curve_plot as stage
        case "cross-task":
            from bertvision.stages.cross_task import build_cross_task as stage
        case "bundle":
            from bertvision.serving.bundle_writer import bundle_heads as stage
        case "serve-bundles":
            from bertvision.serving.picked import serve_picks as stage
        case "predict":
            from bertvision.serving.predictions import predict_unlabelled as stage
        case "serve":
            from bertvision.serving.app import serve as stage
        case _:
            raise KeyError(f"no stage for command {command!r}")
    return stage
