"""Every command, in the order the pipeline runs them, with its line of help, and the function it
runs, imported only when that command runs: importing every stage (torch, transformers, optuna,
matplotlib) takes about 10 s against 0.3 s for the command layer alone, and most commands need a
few of them. Written as import statements, so that a reader and an import drawing follow every
command to its stage."""

from __future__ import annotations

from collections.abc import Callable

COMMANDS = {
    "download": "task source -> canonical parquet splits (rule download)",
    "tokenize": "canonical splits -> token ids (rule tokenize)",
    "finetune": "partial fine-tuning with checkpoints at epoch fractions (rule finetune)",
    "score-bert": "BERT's own head at a checkpoint, scored on selection and dev (rule score_bert)",
    "baseline": "full fine-tuning, the epoch kept chosen on the selection split (rule baseline)",
    "embed": "the backbone's own sentence embedding of every text of a task (rule embed)",
    "peer": "a peer method (LoRA, BitFit, SetFit, the backbone's embedding), chosen on selection (rule peer)",
    "bert-curve": "BERT's own fine-tuning curve, scored at every point (rule bert_curve)",
    "finetune-mixture": "fine-tune one encoder on a mixture of tasks, a shared encoder (rule finetune_mixture)",
    "extract": "one shard of every split's hidden states of every layer (rule extract)",
    "manifest": "check a checkpoint's shards and write its manifest (rule feature_manifest)",
    "train-heads": "train every head on one checkpoint's features, per seed (rules train_heads, train_heads_subset)",
    "race-checkpoint": "the race at a checkpoint: does fine-tuning go on (rule race_checkpoint)",
    "transfer": "heads trained on one checkpoint, evaluated on every checkpoint's features (rule transfer)",
    "head-transfer": "a task's heads applied as they are to a task with the same labels (rule head_transfer)",
    "search-worker": "run one worker's share of an optuna study of a head (rule search_worker)",
    "search-best": "a finished study's best parameters and trial counts (rule search_best)",
    "tables": "summary, result, cost and timing tables (rule tables)",
    "experiment-tables": "search, data-fraction, transfer and BERT-curve tables (rule experiment_tables)",
    "plots": "PNG plots from the result tables, head and baseline metrics (rule plots)",
    "plot-data-fraction": "score vs share of training data (rule plot_data_fraction)",
    "plot-bert-curve": "BERT's score vs fine-tuning epochs (rule plot_bert_curve)",
    "cross-task": "the cross-task transfer table and heatmap (rule cross_task)",
    "bundle": "one encoder checkpoint, its tokenizer and every task's best heads, for bertvision serve (rule bundle)",
    "serve-bundles": "bundles serving the summary's pick for every task of a run, one per encoder (rule serve_bundles)",
    "predict": "a task's unlabelled file answered by the summary's picked path, as served (rule predict)",
    "serve": "answer every task of one or more bundles over HTTP, one encoder pass per batch and encoder",
    "validate-config": "check a config file (and its overlays) against the schema and the registries",
    "config-keys": "every config key with its type, default and description, as markdown",
    "clean": "remove every artifact folder of a working directory (bertvision.layout.ROOTS)",
}
# commands a person runs, no rule's job: they log no usage line (the requests check reads jobs' logs)
NOT_JOBS = ("serve", "validate-config", "config-keys", "clean")
# the parameter a command takes bare, not as a flag
POSITIONAL = {"serve": "bundles", "validate-config": "configs"}


def stage_of(command: str) -> Callable:
    """The stage function behind ``command`` (a name of ``COMMANDS``)."""
    match command:
        case "validate-config":
            from bertvision.config.validate import validate_config_file as stage
        case "config-keys":
            from bertvision.config.reference import print_keys as stage
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
            from bertvision.serving.server import serve as stage
        case _:
            raise KeyError(f"no stage for command {command!r}")
    return stage
