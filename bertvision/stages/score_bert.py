"""The ``score_bert`` stage: BERT's own head at a fine-tuned checkpoint, scored on the selection
split and the evaluation splits (its row in the tables; its logits feed the head + BERT
ensembles). Where the checkpoint's states are stored, its extraction already ran the task model
over those splits and kept the head's outputs beside the states (``extract --bert-logits``): they
are only scored here, so the checkpoint is read once. Where they are streamed (``store: false``),
no extraction runs, and this job runs the model itself."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from bertvision.config.settings import BertScoringSettings, FinetuneCompute
from bertvision.errors import SettingsError
from bertvision.evaluation.ensemble import save_logits
from bertvision.features import bert_outputs
from bertvision.files import atomic_write_json, atomic_write_parquet, read_json
from bertvision.layout import BERT_LOGITS, BERT_METRICS, BERT_PREDICTIONS, TRAIN_RECORD
from bertvision.models.encoder_io import load_task_model, pad_id
from bertvision.registry.task_spec import TaskSpec, scored_splits
from bertvision.runtime.device import pick_device, resolve_precision, set_threads
from bertvision.training.encoder import EVALUATORS, SCORERS, EvalData

log = logging.getLogger(__name__)


def score_bert(
    task: TaskSpec,
    compute: FinetuneCompute,
    checkpoint_dir: Path,
    tokens_dir: Path,
    raw_dir: Path,
    shard_dirs: list[Path] | None = None,
    settings: BertScoringSettings | None = None,
    threads: int | None = None,
) -> dict:
    """Score BERT's head at ``checkpoint_dir`` from the outputs its extraction's ``shard_dirs``
    kept, or (none given) by running the checkpoint's task model over the scored splits with
    ``settings``' batch; write its predictions, logits and record (the training record with its
    metrics) there. The rule gives ``settings`` only to the second, so that a new scoring batch
    reruns no job whose scores come from an extraction."""
    checkpoint_dir = Path(checkpoint_dir)
    evals = EvalData.read(tokens_dir, raw_dir, scored_splits(task))
    started = time.perf_counter()
    facts = {}
    if shard_dirs:
        logits = bert_outputs.joined_outputs(shard_dirs, evals.splits, task.kind)
        metrics, predictions = SCORERS[task.kind](task, logits, evals.splits, evals.questions)
        source = "extraction"
        facts["extraction_pass_seconds"] = bert_outputs.pass_seconds(shard_dirs, evals.splits)
        # fine-tuning's precision is the record's own; its scores are the extraction's, in its precision
        facts["scored_in"] = bert_outputs.pass_computed_in(shard_dirs)
    else:
        if settings is None:
            raise SettingsError("--settings: required where no --shard-dirs are given (the checkpoint is run here)")
        set_threads(threads)
        device = pick_device(compute.device)
        model = load_task_model(str(checkpoint_dir), task.kind).to(device).eval()
        precision = resolve_precision(device, compute.precision, model)
        metrics, predictions, logits = EVALUATORS[task.kind](
            task, model, evals.splits, evals.questions, settings.eval_batch_size, device, precision, pad_id(model)
        )
        source = "own pass"
        facts["scored_in"] = precision
    atomic_write_parquet(predictions, checkpoint_dir / BERT_PREDICTIONS)
    save_logits(checkpoint_dir / BERT_LOGITS, logits)
    record = {
        **read_json(checkpoint_dir / TRAIN_RECORD),
        "metrics": metrics,
        "scored_from": source,  # the extraction's pass, or this job's own
        "scoring_seconds": time.perf_counter() - started,
        **facts,
    }
    atomic_write_json(record, checkpoint_dir / BERT_METRICS)
    log.info("BERT at checkpoint %s, scored from the %s: %s", record["checkpoint"], source, metrics)
    return record
