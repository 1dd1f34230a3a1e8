"""Data-parallel fine-tuning under DistributedDataParallel, with real processes: two gloo ranks
on CPU (the code path of NCCL on GPUs) train the same weights as one process on the same global
batches. The batches include sizes two does not divide and a batch of one row (rank 1's slice
empty); micro-batches (the out-of-memory retry) accumulate without all-reducing; and in a task
mixture each step leaves the other tasks' output layers untouched."""

from __future__ import annotations

import json
import os
import socket
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bertvision.data.tokenized import TokenizedSplit
from bertvision.registry.tasks import get_task
from bertvision.runtime.distributed import Ranks
from bertvision.training.encoder import EncoderTrainer, optimizer_step_state
from bertvision.training.encoder_session import models_sharing_one_encoder

# max_grad_norm: no clipping, so that the gradients' norms are compared as they come (AdamW's
# step depends little on a gradient's scale: a wrong factor shows plainly in the norms only)
SETTINGS = SimpleNamespace(learning_rate=1e-3, batch_size=8, warmup_ratio=0.2, weight_decay=0.01, max_grad_norm=1e6)
SIZES = (8, 5, 1, 7, 3)  # rows per optimizer step: two ranks split 5, 7 and 3 unevenly; 1 leaves rank 1 nothing
# name -> (tasks, micro-batches per batch); "mixture": a classification and a span task over one encoder
SCENARIOS = {
    "single": (("mrpc",), 1),
    "micro2": (("mrpc",), 2),
    "micro3": (("mrpc",), 3),
    "mixture": (("mrpc", "squad2"), 2),
}
ATOL = 1e-6


def synthetic_split(kind: str, n: int = 32, seed: int = 0) -> TokenizedSplit:
    """Random rows of the task kind, of different lengths (span rows too: the span loss is a
    softmax over each window's real tokens, whatever a rank's slice is padded to)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, 20, n)
    df = pd.DataFrame(
        {
            "input_ids": [np.r_[101, rng.integers(1000, 5000, k - 2), 102] for k in lengths],
            "token_type_ids": [np.r_[np.zeros(k // 2, np.int64), np.ones(k - k // 2, np.int64)] for k in lengths],
            "length": lengths,
        }
    )
    if kind == "span":
        start = rng.integers(1, lengths - 2)
        return TokenizedSplit(
            df.assign(example=np.arange(n), start=start, end=start + 1, offsets=[np.full(2 * k, -1) for k in lengths])
        )
    return TokenizedSplit(df.assign(idx=np.arange(n), label=rng.integers(0, 2, n)))


def steps(tasks) -> list[tuple[str, np.ndarray]]:
    """(task, rows) of each optimizer step: the sizes in turn, the tasks taking turns."""
    order = np.random.default_rng(1).permutation(32)
    return [(tasks[i % len(tasks)], order[:size]) for i, size in enumerate(SIZES)]


def train(model_dir, ranks: Ranks, tasks, micro_batches: int) -> dict:
    """Train on ``steps(tasks)`` as the stages do; the weights and what rank 0 saw."""
    specs = [get_task(t) for t in tasks]
    models = models_sharing_one_encoder(specs, str(model_dir), seed=1)
    device = torch.device("cpu")
    shared = optimizer_step_state(models, SETTINGS, 10, device, "fp32", ranks) if len(models) > 1 else None
    trainers = {
        t.name: EncoderTrainer(
            t,
            models[t.name],
            synthetic_split(t.kind),
            SETTINGS,
            10,
            device,
            "fp32",
            ranks,
            micro_batches,
            shared_step=shared,
        )
        for t in specs
    }
    net, optimizer = next(iter(trainers.values())).net, shared.optimizer if shared else trainers[tasks[0]].optimizer
    syncs = []  # one entry per all-reduce of the gradients (its last bucket)
    norms = []  # the gradient's norm at each optimizer step

    def gradient_norm(opt, args, kwargs):
        grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))))

    def counting_allreduce(state, bucket):
        syncs.append(bucket.is_last())
        return allreduce_hook(state, bucket)  # DDP's own averaging all-reduce

    if isinstance(net, DistributedDataParallel):
        net.register_comm_hook(None, counting_allreduce)
    optimizer.register_step_pre_hook(gradient_norm)
    for name, rows in steps(tasks):
        trainers[name].train_step(rows)
    weights = {f"{name}.{k}": v.detach().clone() for name, m in models.items() for k, v in m.state_dict().items()}
    return {
        "weights": weights,
        "losses": [t.losses for t in trainers.values()],
        "syncs": sum(syncs),
        "norms": norms,
        "ddp": isinstance(net, DistributedDataParallel),
        "one_net": all(t.net is net for t in trainers.values()),
        "plain_models": not any(isinstance(m, DistributedDataParallel) for m in models.values()),
    }


def rank_main(rank: int, world: int, port: int, model_dir, out) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    ranks, _ = Ranks.from_env(torch.device("cpu"))
    results = {name: train(model_dir, ranks, tasks, micro) for name, (tasks, micro) in SCENARIOS.items()}
    if ranks.main:
        torch.save(results, out)
    ranks.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    """A dropout-free copy of the tiny BERT: ranks and the one process compute the same thing."""
    path = tmp_path_factory.mktemp("ddp-model")
    for f in tiny_bert.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def two_ranks(model_dir, tmp_path_factory):
    """Every scenario trained by two gloo ranks (spawned processes); rank 0's results."""
    out = tmp_path_factory.mktemp("ddp") / "rank0.pt"
    context = mp.spawn(rank_main, args=(2, free_port(), model_dir, out), nprocs=2, join=False)
    deadline = time.monotonic() + 120  # a rank left waiting in a collective would hang for 30 min
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two ranks hung (a collective that not every rank joined)")
    return torch.load(out)


@pytest.fixture(scope="module")
def one_process(model_dir):
    """The reference: one process, whole batches (no micro-batches)."""
    return {
        name: train(model_dir, Ranks(), tasks, 1)
        for name, (tasks, _) in {"single": SCENARIOS["single"], "mixture": SCENARIOS["mixture"]}.items()
    }


# The span output layer's bias: its gradient is zero up to float error (adding a constant to
# every position's logit leaves the softmax as it is), and AdamW's normalised step turns that
# error into steps of up to the learning rate.
NOISE_ONLY = ("squad2.qa_outputs.bias",)


def assert_same_weights(got: dict, want: dict, initial: dict | None = None) -> None:
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want if k not in NOISE_ONLY)
    assert worst < ATOL, worst
    if initial is not None:  # training moved the weights by far more than the tolerance
        assert max(float((want[k] - initial[k]).abs().max()) for k in want) > 1000 * ATOL


def test_two_ranks_under_ddp_train_the_same_weights_as_one_process(two_ranks, one_process, model_dir):
    got, want = two_ranks["single"], one_process["single"]
    assert got["ddp"] and got["plain_models"]  # the steps ran through DDP; the model saved is the plain one
    assert not want["ddp"]
    initial = {
        f"mrpc.{k}": v
        for k, v in models_sharing_one_encoder([get_task("mrpc")], str(model_dir), 1)["mrpc"].state_dict().items()
    }
    assert_same_weights(got["weights"], want["weights"], initial)
    assert got["syncs"] == len(SIZES)  # one all-reduce per optimizer step
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)  # the global batch's mean loss
    np.testing.assert_allclose(got["norms"], want["norms"], rtol=1e-5)  # its gradient


@pytest.mark.parametrize("micro_batches", [2, 3])
def test_micro_batches_on_two_ranks_accumulate_without_all_reducing(two_ranks, one_process, micro_batches):
    got = two_ranks[f"micro{micro_batches}"]
    assert got["ddp"]
    assert_same_weights(got["weights"], one_process["single"]["weights"])
    np.testing.assert_allclose(got["norms"], one_process["single"]["norms"], rtol=1e-5)
    # only each batch's last micro-batch all-reduced (the others ran under no_sync)
    assert got["syncs"] == len(SIZES)


def test_a_task_mixture_on_two_ranks_leaves_the_other_tasks_output_layers_untouched(two_ranks, one_process):
    """Each step trains the encoder and one task's output layer; AdamW must not move the other
    task's output layer (as it would if DDP gave it zero gradients instead of none)."""
    got, want = two_ranks["mixture"], one_process["mixture"]
    assert got["ddp"] and got["one_net"] and got["plain_models"]
    assert_same_weights(got["weights"], want["weights"])
    assert got["syncs"] == len(SIZES)
    np.testing.assert_allclose(got["norms"], want["norms"], rtol=1e-5)
    for task_losses, want_losses in zip(got["losses"], want["losses"]):
        np.testing.assert_allclose(task_losses, want_losses, rtol=1e-5)


def test_a_span_task_first_in_a_mixture_shares_an_encoder_every_task_model_reads(tiny_bert):
    """A mixture listing a span task first shared its model's encoder, which has no pooler, and
    the classification models after it failed in BERT's pooled output ("tuple index out of range")."""
    models = models_sharing_one_encoder([get_task("squad2"), get_task("mrpc")], str(tiny_bert), seed=1)
    assert models["squad2"].base_model is models["mrpc"].base_model
    ids = torch.tensor([[101, 2000, 2001, 102]])
    assert models["mrpc"](input_ids=ids).logits.shape == (1, 2)
    assert models["squad2"](input_ids=ids).start_logits.shape == (1, 4)
