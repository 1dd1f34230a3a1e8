"""Out-of-memory retries: a job that runs out of GPU memory exits with a clear message, and
the next attempt splits each batch into micro-batches, with the same result."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from bertvision.runtime.device import SIMULATE_OOM_ENV
from tests.conftest import workflow_settings


@pytest.fixture(scope="module")
def prepared(tiny_bert, tmp_path_factory):
    """A dropout-free copy of the tiny BERT (so the comparison is exact up to float error), and
    MRPC downloaded and tokenized for it."""
    root = tmp_path_factory.mktemp("retry")
    model = root / "tiny"
    model.mkdir()
    for f in tiny_bert.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
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


CPU = json.dumps({"device": "cpu", "precision": "auto"})


def finetune_args(root, settings, out):
    return [
        "finetune",
        "--task",
        "mrpc",
        "--model",
        "tiny",
        "--settings",
        settings.to_json(),
        "--compute",
        CPU,
        "--tokens-dir",
        str(root / "tokens"),
        "--raw-dir",
        str(root / "raw"),
        "--out-dir",
        str(root / out),
        "--seed",
        "1",
        "--threads",
        "1",
    ]


def finetune(root, model, settings, out, micro_batches, env=None, check=True):
    return bertvision(*finetune_args(root, settings, out), "--micro-batches", str(micro_batches), env=env, check=check)


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
    metrics = [json.loads((root / d / "ckpt-1/eval_metrics.json").read_text())["metrics"] for d in ("whole", "split")]
    assert metrics[0]["dev"] == pytest.approx(metrics[1]["dev"], abs=1e-6)


def test_extraction_retries_with_smaller_batches(prepared):
    root, model, settings = prepared
    if not (root / "whole/ckpt-1/model.safetensors").exists():
        finetune(root, model, settings, "whole", 1)
    args = [
        "extract",
        "--task",
        "mrpc",
        "--checkpoint",
        str(root / "whole/ckpt-1"),
        "--tokens-dir",
        str(root / "tokens"),
        "--shard",
        "0",
        "--shards",
        "1",
        "--threads",
        "1",
        "--settings",
        json.dumps({"batch_size": 16, "block_rows": 8192, "block_tokens": 65536}),
        "--compute",
        CPU,
        "--attrs",
        json.dumps({"model": "tiny", "task": "mrpc", "checkpoint": "1", "ft_seed": 1, "label_kind": "classification"}),
    ]
    oom = {SIMULATE_OOM_ENV: "8"}
    failed = bertvision(*args, "--out-dir", str(root / "f1"), "--micro-batches", "1", env=oom, check=False)
    assert failed.returncode == 3 and "out of memory" in failed.stderr
    assert not (root / "f1").exists()  # nothing half-written
    bertvision(*args, "--out-dir", str(root / "f2"), "--micro-batches", "2", env=oom)
    assert (root / "f2" / "dev.h5").exists()


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
