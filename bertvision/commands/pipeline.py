"""The workflow's commands, one per rule, in the order the pipeline runs them: each names its stage
and the flags that fill the stage's parameters (``commands.arguments``). The warm pool imports
every stage named here ahead of the jobs (``commands.warm``)."""

from __future__ import annotations

from bertvision.commands.arguments import (
    INT,
    OPTIONAL_PATHS,
    PATH,
    PATHS,
    TASK,
    THREADS,
    Arg,
    MicroBatches,
    NamedSettings,
    NamePaths,
    Switch,
    command,
    feature_source_arg,
    json_arg,
    path,
    paths,
    settings,
)
from bertvision.config import settings as typed


def checkpoint_arg(text: str):
    from bertvision.layout import Checkpoint

    return Checkpoint.named(text)


def with_splits(values: dict) -> dict:
    """A stage that reads every split of a task: the task's split names in place of the task."""
    from bertvision.registry.task_spec import splits_of

    task = values.pop("task")
    return {**values, "splits": splits_of(task)}


def with_scored_splits(values: dict) -> dict:
    """The extraction: the task's splits, and the ones BERT's head is scored on."""
    from bertvision.registry.task_spec import scored_splits, splits_of

    task = values.pop("task")
    return {**values, "splits": splits_of(task), "scored_splits": scored_splits(task)}


def with_memory_bound(values: dict) -> dict:
    """A stage that only applies trained heads: of their training settings, the memory bound."""
    head_settings = values.pop("settings")
    return {**values, "in_memory_max_mb": head_settings.in_memory_max_mb}


def with_runs(values: dict) -> dict:
    """The tables' runs as the layout's records."""
    from bertvision.layout import Run

    return {**values, "runs": [Run.from_json(keys) for keys in values["runs"]]}


def with_head_metrics(values: dict) -> dict:
    """The plots read every head's metrics file of the heads directories."""
    from bertvision.layout import head_metrics_files

    head_dirs = values.pop("head_dirs")
    return {**values, "head_metrics": head_metrics_files(head_dirs)}


MODEL = Arg("the backbone's name in the config (recorded with the results)")
RAW_DIR = path("the task's canonical splits (span decoding)")
COMPUTE = settings(typed.FinetuneCompute)
ACCUMULATE = MicroBatches("gradient accumulation steps per batch")
FEATURES = Arg(
    "the feature manifest, or a stream source (JSON) for store: false",
    type=feature_source_arg,
    metavar="MANIFEST|SOURCE_JSON",
)
APPLIED_HEADS = dict(settings=settings(typed.HeadTrainingSettings), runtime=settings(typed.HeadRuntimeSettings),
                     out=PATH, threads=THREADS)  # fmt: skip
ENCODER = dict(task=TASK, model_name=MODEL, compute=COMPUTE, tokens_dir=PATH, raw_dir=RAW_DIR, out_dir=PATH, seed=INT,
               micro_batches=ACCUMULATE, threads=THREADS)  # fmt: skip
TRAINED_ENCODER = {k: v for k, v in ENCODER.items() if k != "raw_dir"}  # fine-tuning reads no raw rows

COMMANDS = [
    command("download", "task source -> canonical parquet splits (rule download)",
            task=TASK, settings=settings(typed.DownloadSettings), out_dir=PATH),
    command("tokenize", "canonical splits -> token ids (rule tokenize)",
            task=TASK, settings=settings(typed.TokenizeSettings), raw_dir=PATH, out_dir=PATH),
    command("finetune", "partial fine-tuning with checkpoints at epoch fractions (rule finetune)",
            out_of_memory=True,
            **TRAINED_ENCODER, settings=settings(typed.FinetuneSettings),
            checkpoint=Arg("the checkpoint (epoch fraction) to train to", type=checkpoint_arg),
            previous=path("the checkpoint directory it goes on from (the run's one before; none for the first)",
                          required=False)),
    command("score-bert", "BERT's own head at a checkpoint, scored on selection and dev (rule score_bert)",
            task=TASK, settings=settings(typed.FinetuneSettings), compute=COMPUTE,
            checkpoint_dir=path("the checkpoint's directory"), tokens_dir=PATH, raw_dir=RAW_DIR,
            shard_dirs=paths("its extraction's shards, in shard order, which kept the head's outputs (none: run "
                             "the model)", required=False), threads=THREADS),
    command("baseline", "full fine-tuning, the epoch kept chosen on the selection split (rule baseline)",
            out_of_memory=True,
            **ENCODER, settings=settings(typed.BaselineSettings)),
    command("embed", "the backbone's own sentence embedding of every text of a task, for the peers that train no "
            "encoder (rule embed)",
            task=TASK, model_name=MODEL, settings=settings(typed.PeerSettings), compute=COMPUTE, raw_dir=PATH,
            out=PATH, threads=THREADS),
    command("peer", "a peer method (LoRA, BitFit, SetFit, the backbone's embedding), its settings chosen on "
            "the selection split (rule peer)",
            out_of_memory=True,
            **ENCODER, settings=settings(typed.PeerSettings),
            embeddings=path("the task's sentence embeddings (rule embed), for a peer that trains no encoder",
                            required=False)),
    command("bert-curve", "BERT's own fine-tuning curve, scored at every point (rule bert_curve)",
            out_of_memory=True,
            task=TASK, model_name=MODEL, compute=COMPUTE, tokens_dir=PATH, raw_dir=RAW_DIR, out=PATH, seed=INT,
            micro_batches=ACCUMULATE, threads=THREADS, settings=settings(typed.CurveSettings)),
    command("finetune-mixture", "fine-tune one encoder on a mixture of tasks, a shared encoder (rule finetune_mixture)",
            out_of_memory=True,
            encoder_name=Arg("the mixture's name in the config (recorded)"), model_name=MODEL,
            settings=settings(typed.MixtureSettings), compute=COMPUTE,
            tokens_dirs=NamePaths("TASK=DIR, every mixed task"), out_dir=PATH, seed=INT, micro_batches=ACCUMULATE,
            threads=THREADS),
    command("extract", "one shard of every split's hidden states of every layer (rule extract)",
            adapt=with_scored_splits, out_of_memory=True,
            task=TASK, checkpoint_dir=PATH, tokens_dir=PATH, out_dir=PATH, shard=INT,
            n_shards=INT, settings=settings(typed.ExtractSettings),
            compute=settings(typed.ExtractCompute),
            attrs=Arg("where the features come from (stored in each shard)", type=json_arg),
            micro_batches=MicroBatches("divide the batch size by this"), threads=THREADS,
            bert_logits=Switch("run the task model and keep BERT's outputs on the scored splits (rule score_bert)")),
    command("manifest", "check a checkpoint's shards and write its manifest (rule feature_manifest)",
            adapt=with_splits,
            task=TASK, out=PATH, shard_dirs=PATHS),
    command("train-heads",
            "train every head on one checkpoint's features, per seed (rules train_heads, train_heads_subset)",
            task=TASK, heads=NamedSettings("head name -> its HeadSettings (see below)", cls=typed.HeadSettings),
            runtime=settings(typed.HeadRuntimeSettings), race=settings(typed.RaceSettings),
            manifest=FEATURES, raw_dir=RAW_DIR, seeds=Arg(type=int, nargs="+"),
            bert_logits=path("BERT's eval_logits.npz at this checkpoint (ensembles; none on a shared encoder)",
                             nargs="?", required=False),
            out_dir=PATH,
            searched=NamePaths("HEAD=best.json: train HEAD with its search's best parameters", nargs="*",
                               required=False, default=[]),
            train_fraction=Arg("train on this nested share of the rows", type=float, required=False),
            survivors_from=path("the first fine-tuning seed's train_heads output at this checkpoint: train only the "
                                "heads its race kept", nargs="?", required=False),
            threads=THREADS),
    command("race-checkpoint", "the race at a checkpoint: does fine-tuning go on (rule race_checkpoint)",
            task=TASK, model_name=MODEL, checkpoint=Arg("the checkpoint decided", type=checkpoint_arg),
            head_dirs=paths("train_heads outputs at this checkpoint, one per fine-tuning seed"),
            race=settings(typed.RaceSettings),
            previous=path("the decision at the checkpoint before", nargs="?", required=False),
            last=Switch("this is the last configured checkpoint"),
            out=PATH),
    command("transfer", "evaluate heads trained on one checkpoint on every checkpoint's features (rule transfer)",
            adapt=with_memory_bound,
            task=TASK, head_dirs=paths("train_heads outputs, one per checkpoint"),
            manifests=FEATURES.but(nargs="+"), raw_dir=path("the task's canonical splits"), **APPLIED_HEADS),
    command("head-transfer", "a task's heads applied as they are to a task with the same labels (rule head_transfer)",
            adapt=with_memory_bound,
            source=TASK.but(help="the task whose heads are applied"),
            target=TASK.but(help="the task they are applied to"),
            head_dir=path("the source task's train_heads output"), heads=Arg("head names to apply", nargs="+"),
            manifest=path("the target's features of the source's encoder"),
            raw_dir=path("the target task's canonical splits"), **APPLIED_HEADS),
    command("search-worker", "run one worker's share of an optuna study of a head (rule search_worker)",
            task=TASK, keys=Arg("the study's keys: model, task, ftseed, frac, head", type=json_arg),
            head=settings(typed.HeadSettings), runtime=settings(typed.HeadRuntimeSettings),
            search=settings(typed.SearchSettings), manifest=FEATURES, raw_dir=PATH,
            storage=Arg("journal file path or RDB URL"), worker=INT, out=PATH, threads=THREADS),
    command("search-best", "a finished study's best parameters and trial counts (rule search_best)",
            worker_records=paths("the study's worker records"), out=PATH),
    # the reporting commands read finished records, never train
    command("tables", "summary, result, cost and timing tables (rule tables)", adapt=with_runs,
            bert_metrics=OPTIONAL_PATHS, baseline_metrics=OPTIONAL_PATHS, head_dirs=OPTIONAL_PATHS,
            manifests=OPTIONAL_PATHS, search_workers=OPTIONAL_PATHS, race_decisions=OPTIONAL_PATHS,
            peer_metrics=OPTIONAL_PATHS,
            peers=Arg("task -> the peers the config names for it, as JSON", type=json_arg, required=False),
            runs=Arg("every run, [{model, task, ftseed, frac}, ...]: their jobs' benchmark files give the times",
                     type=json_arg),
            n_shards=Arg("extraction shards per checkpoint", type=int),
            head_order=Arg("head names in table order", nargs="*", required=False, default=[]),
            out_dir=PATH),
    command("experiment-tables", "search, data-fraction, transfer and BERT-curve tables (rule experiment_tables)",
            best_files=paths("best.json of every study", required=False),
            subset_dirs=OPTIONAL_PATHS, head_dirs=OPTIONAL_PATHS, bert_metrics=OPTIONAL_PATHS,
            transfer_files=paths("transfer records", required=False),
            curve_files=paths("bert_curve records", required=False), out_dir=PATH),
    command("plots", "PNG plots from the result tables, head and baseline metrics (rule plots)",
            adapt=with_head_metrics,
            result_csvs=paths("glue.csv / squad.csv"),
            summary_csv=path("summary.csv (the score-vs-seconds plot)", required=False),
            methods_csv=path("methods.csv (the methods' cost-score plot)", required=False),
            head_dirs=OPTIONAL_PATHS,
            baseline_metrics=paths("full fine-tuning records (the training-loss plot)", required=False),
            tasks=Arg(nargs="+"), out_dir=PATH),
    command("plot-data-fraction", "score vs share of training data (rule plot_data_fraction)",
            table_csv=path("data_fraction.csv"), out=PATH),
    command("plot-bert-curve", "BERT's score vs fine-tuning epochs (rule plot_bert_curve)",
            table_csv=path("bert_curve.csv"), out=PATH),
    command("cross-task", "the cross-task transfer table and heatmap (rule cross_task)",
            encoders=Arg("the shared encoders, [{name, kind, ...}, ...]", type=json_arg), models=Arg(nargs="+"),
            ft_seeds=Arg(type=int, nargs="+"), heads=Arg('{"task": [head names], ...}', type=json_arg),
            epochs=Arg('{"mixture": epochs, ...}', type=json_arg),
            transfer_files=paths("head_transfer records", required=False),
            out_dir=PATH, plot=PATH),
]  # fmt: skip
