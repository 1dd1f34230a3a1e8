"""Fine-tuning one checkpoint per job (so that a race can stop a run between two): a run taken in
steps, each job going on from the checkpoint before, is bit for bit the run taken at once, with
dropout on and checkpoints in the middle of a pass over the rows; and so is a finished run extended
by a later checkpoint, which goes on from a last checkpoint that kept no optimizer state."""

import json

import pytest
import torch
from safetensors.torch import load_file

from bertvision.layout import RESUME_STATE, TRAIN_RECORD, Checkpoint, checkpoint_dir
from bertvision.registry.tasks import get_task
from bertvision.stages.finetune import finetune
from tests.conftest import workflow_settings
from tests.stages import download_and_tokenize


def settings_with(model, fractions):
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(model)}},
        tasks={"mrpc": {"train_size": 44, "eval_size": 16}},
        finetune={
            "epoch_fractions": fractions,
            "settings": {"batch_size": 8, "learning_rate": 1e-3, "schedule_epochs": 2},
        },
        resources={"warm_start": False},
    )


@pytest.fixture(scope="module")
def tokens(tiny_bert, tmp_path_factory):
    settings = settings_with(tiny_bert, [2])
    return download_and_tokenize(settings, "tiny", "mrpc", tmp_path_factory.mktemp("steps"))


def run(root, tiny_bert, fractions, out, after=None):
    """Each checkpoint's job as rule finetune runs it: going on from the one before, the last
    dropping its optimizer state. ``after``: run only the checkpoints after that one of ``out``."""
    settings = settings_with(tiny_bert, fractions)
    compute = settings.finetune_compute().replace(device="cpu", precision="fp32")
    previous = None if after is None else checkpoint_dir(root / out, after)
    for checkpoint in [c for c in settings.checkpoints if after is None or c.fraction > after.fraction]:
        state = "drop" if checkpoint == settings.checkpoints[-1] else "keep"
        finetune(get_task("mrpc"), "tiny", settings.finetune("tiny", "mrpc", checkpoint), compute, root / "tokens",
                 root / out, 1, checkpoint, previous=previous, optimizer_state=state, threads=1)  # fmt: skip
        previous = checkpoint_dir(root / out, checkpoint)
    return root / out


def same_weights(a_dir, b_dir) -> bool:
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_in_steps_is_the_run_at_once(tokens, tiny_bert):
    config = json.loads((tiny_bert / "config.json").read_text())
    assert config.get("hidden_dropout_prob", 0.1) > 0  # dropout draws from torch's generator
    # 40 training rows (10% held out for selection), batch 8: 5 steps a pass; 0.5 and 1.5 epochs
    # fall in the middle of a pass
    steps = run(tokens, tiny_bert, [0, 0.5, 1, 1.5, 2], "steps")
    once = run(tokens, tiny_bert, [2], "once")
    assert same_weights(steps / "ckpt-2", once / "ckpt-2")
    ra, rb = (json.loads((d / "ckpt-2" / TRAIN_RECORD).read_text()) for d in (steps, once))
    assert ra["step"] == rb["step"] == 10 and ra["examples_seen"] == rb["examples_seen"]
    assert ra["train_loss_recent"] == rb["train_loss_recent"]
    # every checkpoint's record carries the training seconds of the whole run to it
    seconds = [json.loads((steps / f"ckpt-{c}" / TRAIN_RECORD).read_text())["train_seconds"] for c in ("0.5", "1", "2")]
    assert seconds == sorted(seconds)
    # the last checkpoint keeps no optimizer state (no run goes on from it)
    assert not torch.load(steps / "ckpt-2" / RESUME_STATE, weights_only=False)["resumable"]
    assert torch.load(steps / "ckpt-1" / RESUME_STATE, weights_only=False)["resumable"]


def test_a_later_checkpoint_goes_on_from_a_last_one_that_dropped_its_optimizer(tokens, tiny_bert):
    """A finished run (its last checkpoint, 1, kept no optimizer state) extended by 1.5 and 2: the
    new job replays 1's steps, and the run ends where the run taken at once ends."""
    finished = run(tokens, tiny_bert, [0, 0.5, 1], "finished")
    assert not torch.load(finished / "ckpt-1" / RESUME_STATE, weights_only=False)["resumable"]
    before = (finished / "ckpt-1" / "model.safetensors").stat().st_mtime_ns
    extended = run(tokens, tiny_bert, [0, 0.5, 1, 1.5, 2], "finished", after=Checkpoint(1))
    assert (finished / "ckpt-1" / "model.safetensors").stat().st_mtime_ns == before
    once = run(tokens, tiny_bert, [2], "once-again")
    assert same_weights(extended / "ckpt-2", once / "ckpt-2")
    # the replay's seconds are not the path's: the record goes on from checkpoint 1's seconds
    seconds = [
        json.loads((extended / f"ckpt-{c}" / TRAIN_RECORD).read_text())["train_seconds"] for c in ("1", "1.5", "2")
    ]
    assert seconds[0] < seconds[1] < seconds[2], seconds  # 1.5 adds its half epoch to 1's whole one


def test_settings_name_no_other_checkpoint(tiny_bert):
    """What a checkpoint's job computes from leaves out the other checkpoints: adding a later one
    changes no earlier job's parameters (rule finetune reruns nothing that ran)."""
    short, longer = (settings_with(tiny_bert, f).finetune("tiny", "mrpc") for f in ([0, 0.5], [0, 0.5, 1, 2]))
    assert short == longer and short.schedule_epochs == 2
    # checkpoint 0 trains nothing: its job follows from the backbone alone, whatever the optimizer
    untouched = settings_with(tiny_bert, [0, 0.5]).finetune("tiny", "mrpc", Checkpoint(0))
    assert untouched.optimizer is None and untouched.schedule_epochs is None
    assert untouched.backbone == short.backbone


def test_a_missing_previous_checkpoint_fails_clearly(tokens, tiny_bert, tmp_path):
    settings = settings_with(tiny_bert, [0.5, 1])
    with pytest.raises(FileNotFoundError, match="ckpt-0.5"):
        finetune(get_task("mrpc"), "tiny", settings.finetune("tiny", "mrpc"), settings.finetune_compute(),
                 tokens / "tokens", tmp_path, 1, Checkpoint(1), previous=tmp_path / "ckpt-0.5", threads=1)  # fmt: skip


def test_a_regression_starts_at_its_training_labels_mean(tiny_bert, tmp_path):
    """Checkpoint 0 is the task model as fine-tuning initialises it: a regression's output bias is
    the mean of its training labels (BERTVision's heads train on standardized labels; the encoder's
    own head starts where they start), a classification's is left as the library draws it."""
    import numpy as np

    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.layout import split_file

    settings = workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={"stsb": {"train_size": 30, "eval_size": 8}},
        finetune={"epoch_fractions": [0], "settings": {"batch_size": 8}},
        resources={"warm_start": False},
    )
    root = download_and_tokenize(settings, "tiny", "stsb", tmp_path)
    compute = settings.finetune_compute().replace(device="cpu", precision="fp32")
    untouched = settings.finetune("tiny", "stsb", Checkpoint(0))
    finetune(get_task("stsb"), "tiny", untouched, compute, root / "tokens", root / "ft", 1, Checkpoint(0), threads=1)
    labels = TokenizedSplit.read(split_file(root / "tokens", "train")).labels
    bias = load_file(root / "ft" / "ckpt-0" / "model.safetensors")["classifier.bias"]
    assert 1.0 < labels.mean() < 4.0 and bias.item() == pytest.approx(float(np.mean(labels)), abs=1e-6)


def test_settings_without_an_optimizer_train_nothing_so_name_checkpoint_0_only(tokens, tiny_bert, tmp_path):
    """The untouched encoder's settings (no optimizer) given for a checkpoint that trains is a
    mistake of the caller's, refused before anything is written."""
    settings = settings_with(tiny_bert, [0, 0.5])
    untouched = settings.finetune("tiny", "mrpc", Checkpoint(0))
    with pytest.raises(ValueError, match="checkpoint 0.5 trains: its settings need the optimizer's"):
        finetune(get_task("mrpc"), "tiny", untouched, settings.finetune_compute(), tokens / "tokens", tmp_path, 1,
                 Checkpoint(0.5), threads=1)  # fmt: skip
    assert not list(tmp_path.iterdir())
