"""Out-of-memory retries: a job that runs out of GPU memory exits with a clear message, and
the next attempt splits each batch into micro-batches, with the same result (span tasks too,
whose windows each micro-batch pads differently)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from bertvision.config.settings import BertScoringSettings
from bertvision.data.tokenized import TokenizedSplit
from bertvision.registry.tasks import get_task
from bertvision.runtime.device import SIMULATE_OOM_ENV
from bertvision.runtime.distributed import Ranks
from bertvision.training.encoder import EncoderTrainer, load_classifier
from tests.conftest import workflow_settings
from tests.stages import extract_args


def dropout_free_copy(tiny_bert, root):
    """A copy of the tiny BERT without dropout, so that two ways of computing a step compare
    exactly up to float error."""
    model = root / "tiny"
    model.mkdir()
    for f in tiny_bert.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def prepared(tiny_bert, tmp_path_factory):
    """A dropout-free copy of the tiny BERT (so the comparison is exact up to float error), and
    MRPC downloaded and tokenized for it."""
    root = tmp_path_factory.mktemp("retry")
    model = dropout_free_copy(tiny_bert, root)
    settings = workflow_settings(
        backbones={"tiny": {"pretrained": str(model)}},
        tasks={"mrpc": {"train_size": 40, "eval_size": 16}},
        finetune={"epoch_fractions": [1.0], "settings": {"batch_size": 8, "learning_rate": 1e-3}},
    )
    bertvision(
        "download", "--task", "mrpc", "--settings", settings.download("mrpc").to_json(), "--out-dir", str(root / "raw")
    )
    bertvision(
        "tokenize",
        "--task",
        "mrpc",
        "--settings",
        settings.tokenize("tiny", "mrpc").replace(max_length=64).to_json(),
        "--raw-dir",
        str(root / "raw"),
        "--out-dir",
        str(root / "tokens"),
    )
    return root, model, settings.finetune("tiny", "mrpc")


def bertvision(*args, env=None, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "bertvision", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# fp32: the comparisons are exact up to float error; bf16 rounds differently per batch shape.
CPU = json.dumps({"device": "cpu", "precision": "fp32"})


def finetune_args(root, settings, out):
    return [
        "finetune",
        "--task",
        "mrpc",
        "--model-name",
        "tiny",
        "--settings",
        settings.to_json(),
        "--compute",
        CPU,
        "--tokens-dir",
        str(root / "tokens"),
        "--out-dir",
        str(root / out),
        "--seed",
        "1",
        "--checkpoint",
        "1",
        "--threads",
        "1",
    ]


def finetune(root, model, settings, out, micro_batches, env=None, check=True):
    return bertvision(*finetune_args(root, settings, out), "--micro-batches", str(micro_batches), env=env, check=check)


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_out_of_memory_fails_clearly_and_micro_batches_give_the_same_model(prepared):
    root, model, settings = prepared
    oom = {SIMULATE_OOM_ENV: "4"}  # a batch of 8 rows does not fit; 4 does
    failed = finetune(root, model, settings, "oom", 1, env=oom, check=False)
    assert failed.returncode == 3
    assert "CUDA out of memory" in failed.stderr and "--retries" in failed.stderr
    finetune(root, model, settings, "whole", 1)
    finetune(root, model, settings, "split", 2, env=oom)
    whole = load_file(root / "whole/ckpt-1/model.safetensors")
    split = load_file(root / "split/ckpt-1/model.safetensors")
    changed = load_file(model / "model.safetensors")
    name = "encoder.layer.0.attention.self.query.weight"
    assert (whole[f"bert.{name}"] - changed[name]).abs().max() > 1e-4  # training moved the weights
    assert max(float((whole[k] - split[k]).abs().max()) for k in whole) < 1e-4
    for d in ("whole", "split"):  # BERT's head scored by its own pass (streamed states)
        bertvision("score-bert", "--task", "mrpc", "--settings", BertScoringSettings(eval_batch_size=16).to_json(),
                   "--compute", CPU, "--checkpoint-dir", str(root / d / "ckpt-1"), "--tokens-dir", str(root / "tokens"),
                   "--raw-dir", str(root / "raw"), "--threads", "1")  # fmt: skip
    metrics = [json.loads((root / d / "ckpt-1/eval_metrics.json").read_text())["metrics"] for d in ("whole", "split")]
    assert metrics[0]["dev"] == pytest.approx(metrics[1]["dev"], abs=1e-6)


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_extraction_retries_with_smaller_batches(prepared):
    root, model, settings = prepared
    if not (root / "whole/ckpt-1/model.safetensors").exists():
        finetune(root, model, settings, "whole", 1)
    settings = {"batch_size": 16, "block_rows": 8192, "block_tokens": 65536}
    attrs = {"model": "tiny", "task": "mrpc", "checkpoint": "1", "ft_seed": 1, "label_kind": "classification"}
    args = extract_args(root / "whole/ckpt-1", root / "tokens", settings, attrs)
    oom = {SIMULATE_OOM_ENV: "8"}
    failed = bertvision(*args, "--out-dir", str(root / "f1"), "--micro-batches", "1", env=oom, check=False)
    assert failed.returncode == 3 and "out of memory" in failed.stderr
    assert not (root / "f1").exists()  # nothing half-written
    bertvision(*args, "--out-dir", str(root / "f2"), "--micro-batches", "2", env=oom)
    assert (root / "f2" / "dev.h5").exists()


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_two_data_parallel_ranks_train_the_same_model_as_one_process(prepared):
    """torchrun with 2 ranks (gloo on CPU: the same code path as NCCL on GPUs)."""
    root, model, settings = prepared
    if not (root / "whole/ckpt-1/model.safetensors").exists():
        finetune(root, model, settings, "whole", 1)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "bertvision",
    ]
    proc = subprocess.run(
        [*torchrun, *finetune_args(root, settings, "ddp")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 of 2" in proc.stderr
    whole = load_file(root / "whole/ckpt-1/model.safetensors")
    ddp = load_file(root / "ddp/ckpt-1/model.safetensors")
    assert max(float((whole[k] - ddp[k]).abs().max()) for k in whole) < 1e-4


# No clipping and no warmup: every step's gradient reaches AdamW as it is computed.
SPAN_SETTINGS = SimpleNamespace(
    learning_rate=1e-3, batch_size=8, warmup_ratio=0.0, weight_decay=0.01, max_grad_norm=1e6
)
# Windows of very different lengths, short ones first: the halves and quarters that the
# micro-batches take are each padded to a different width than the whole batch.
SPAN_LENGTHS = (7, 9, 10, 12, 30, 41, 52, 64)


def span_windows(lengths, seed: int = 0) -> TokenizedSplit:
    """Context windows with random tokens and an answer span inside each."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    start = rng.integers(1, lengths - 2)
    return TokenizedSplit(
        pd.DataFrame(
            {
                "input_ids": [np.r_[101, rng.integers(1000, 5000, k - 2), 102] for k in lengths],
                "token_type_ids": [np.r_[np.zeros(k // 2, np.int64), np.ones(k - k // 2, np.int64)] for k in lengths],
                "length": lengths,
                "example": np.arange(len(lengths)),
                "start": start,
                "end": start + 1,
                "offsets": [np.full(2 * k, -1) for k in lengths],
            }
        )
    )


def span_steps(model_dir, micro_batches: int, steps: int = 3) -> dict:
    """``steps`` optimizer steps of SQuAD fine-tuning on the same batch: the gradient each step
    applied, the losses and the weights after."""
    task = get_task("squad2")
    model = load_classifier(task, str(model_dir), seed=1)
    split = span_windows(SPAN_LENGTHS)
    trainer = EncoderTrainer(
        task, model, split, SPAN_SETTINGS, steps, torch.device("cpu"), "fp32", Ranks(), micro_batches
    )
    gradients = []

    def record(optimizer, args, kwargs):
        grads = [p.grad.reshape(-1) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        gradients.append(torch.cat(grads).clone())

    trainer.optimizer.register_step_pre_hook(record)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for _ in range(steps):
        trainer.train_step(np.arange(len(SPAN_LENGTHS)))
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"gradients": gradients, "losses": trainer.losses, "weights": weights, "initial": initial}


# These add the same amount to every position's start (end) logit, which leaves the softmax as it
# is: their gradient is zero up to float error, and AdamW's normalised step turns that error into
# steps of up to the learning rate.
SHIFT_ONLY = ("qa_outputs.bias", "bert.encoder.layer.1.output.LayerNorm.bias")


def test_span_micro_batches_give_the_same_update_as_one_batch(tiny_bert, tmp_path):
    """The span loss is a softmax over each window's real tokens: Hugging Face's, over every
    padded position, changes with the width a micro-batch is padded to (this test fails with it)."""
    model_dir = dropout_free_copy(tiny_bert, tmp_path)
    whole = span_steps(model_dir, 1)
    moved = max(float((whole["weights"][k] - whole["initial"][k]).abs().max()) for k in whole["weights"])
    assert moved > 1e-3  # the steps trained the model
    for micro in (2, 4):
        split = span_steps(model_dir, micro)
        np.testing.assert_allclose(split["losses"], whole["losses"], rtol=1e-5)
        for got, want in zip(split["gradients"], whole["gradients"]):
            assert float((got - want).abs().max()) < 1e-6 * max(1.0, float(want.abs().max()))
        worst = max(
            float((split["weights"][k] - whole["weights"][k]).abs().max())
            for k in whole["weights"]
            if k not in SHIFT_ONLY
        )
        assert worst < 1e-5, (micro, worst)


def test_the_simulated_out_of_memory_error_comes_above_its_limit_only(monkeypatch):
    from bertvision.runtime.device import check_simulated_oom

    monkeypatch.setenv(SIMULATE_OOM_ENV, "4")
    check_simulated_oom(4)  # a batch of the limit fits, as the retry tests' halved batches must
    with pytest.raises(torch.OutOfMemoryError, match="a batch of 5 rows"):
        check_simulated_oom(5)
