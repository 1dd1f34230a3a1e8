"""The pipeline's stages run in-process for fixtures that build a little run by hand (download and
tokenize done): fine-tune a task, and extract a task's states from a checkpoint into one shard
and train its heads there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bertvision.registry.task_spec import splits_of
from bertvision.registry.tasks import get_task


def download_and_tokenize(settings, model: str, task: str, root: Path, max_length: int = 64) -> Path:
    """``task``'s canonical splits in ``root``/raw and its token ids in ``root``/tokens, by the
    ``download`` and ``tokenize`` commands as the workflow runs them; returns ``root``."""
    from tests.test_retry import bertvision

    bertvision("download", "--task", task, "--settings", settings.download(task).to_json(), "--out-dir",
               str(root / "raw"))  # fmt: skip
    tokenize = settings.tokenize(model, task).replace(max_length=max_length).to_json()
    bertvision("tokenize", "--task", task, "--settings", tokenize, "--raw-dir", str(root / "raw"), "--out-dir",
               str(root / "tokens"))  # fmt: skip
    return root


BERTVISION = [sys.executable, "-m", "bertvision"]


def extract_args(checkpoint_dir, tokens_dir, settings: dict, attrs: dict, out_dir=None) -> list[str]:
    """``bertvision extract``'s arguments on the CPU in fp32, one shard of a task of train, selection
    and dev, the flags the extract rule passes (``out_dir`` None: the caller adds ``--out-dir``)."""
    out = ["--out-dir", str(out_dir)] if out_dir is not None else []
    return ["extract", "--splits", "train", "selection", "dev",
            "--checkpoint-dir", str(checkpoint_dir), "--tokens-dir", str(tokens_dir), *out, "--shard", "0",
            "--n-shards", "1", "--threads", "1", "--settings", json.dumps(settings),
            "--compute", json.dumps({"device": "cpu", "precision": "fp32", "backend": "torch"}),
            "--attrs", json.dumps(attrs)]  # fmt: skip


def with_training(heads: dict, training) -> dict:
    """Head name -> HeadSettings: each spec of ``heads`` with the training settings ``training``
    (what ``WorkflowSettings.head_settings`` gives a job, for heads built by hand)."""
    from bertvision.config.settings import HeadSettings

    return {name: HeadSettings(spec=spec, training=training) for name, spec in heads.items()}


def fine_tune(settings, model: str, task: str, root: Path, out: Path) -> None:
    """Fine-tune ``task`` on ``root``'s tokens; a checkpoint per configured epoch fraction in
    ``out``, one job after another as the workflow runs them, and BERT's head scored at each but
    0 by its own pass (as the workflow scores it for streamed states)."""
    from bertvision.layout import checkpoint_dir
    from bertvision.stages.finetune import finetune
    from bertvision.stages.score_bert import score_bert

    previous = None
    for checkpoint in settings.checkpoints:
        finetune(
            get_task(task),
            model,
            settings.finetune(model, task),
            settings.finetune_compute(),
            root / "tokens" / task,
            out,
            1,
            checkpoint,
            previous=previous,
            threads=1,
        )
        previous = checkpoint_dir(out, checkpoint)
        if checkpoint.fraction > 0:
            score_bert(
                get_task(task),
                settings.finetune_compute(),
                checkpoint_dir(out, checkpoint),
                root / "tokens" / task,
                root / "raw" / task,
                settings=settings.bert_scoring(task),
                threads=1,
            )


def extract_and_train(settings, model: str, task: str, root: Path, checkpoint: Path, out: Path, bert_logits=None):
    """``task``'s states from ``checkpoint`` into out/features/TASK, its heads into out/heads/TASK
    (``bert_logits``: that checkpoint's own model's outputs, so the ensembles are scored)."""
    from bertvision.features.store import write_manifest
    from bertvision.layout import Checkpoint, Run
    from bertvision.stages.extract import extract_shard
    from bertvision.stages.train_heads import train_heads

    splits = list(splits_of(get_task(task)))
    shard = out / "features" / task / "shard-0-of-1"
    extract_shard(
        checkpoint,
        root / "tokens" / task,
        shard,
        0,
        1,
        splits,
        settings.extract(),
        settings.extract_compute(),
        settings.extract_attrs(Run(model, task, 1, Checkpoint(1))),
        threads=1,
    )
    write_manifest([shard], out / "features" / task / "manifest.json", splits)
    train_heads(
        get_task(task),
        settings.head_settings(task),
        settings.head_runtime(),
        out / "features" / task / "manifest.json",
        settings.head_seeds,
        out / "heads" / task,
        threads=1,
        raw_dir=root / "raw" / task,
        bert_logits=bert_logits,
    )
