"""The peer jobs (``stages/peer.run_peer``) run whole on a tiny random BERT and the shipped GLUE
rows: LoRA and BitFit keep the learning rate and epoch best on the selection split and score the
weights of that epoch, SetFit keeps its learning rate best on selection, and each record says what
its run was (trainable parameters, seconds of the kept run, seed, label). Mutants of these choices
(the comparison flipped, the dev split chosen on, the grid's rate or the seed not passed on, the
kept epoch's weights not reloaded) passed every other fast test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bertvision.config.settings import FinetuneCompute
from bertvision.layout import PEER_METRICS, split_file
from bertvision.registry.peers import applicable, inapplicable
from bertvision.registry.tasks import get_task
from bertvision.stages.peer import run_peer
from tests.conftest import workflow_settings
from tests.stages import download_and_tokenize

CPU = FinetuneCompute(device="cpu", precision="fp32")


def peer_settings(tiny_bert: Path, task: str, rows: dict, peers: dict, selection_fraction: float = 0.3):
    return workflow_settings(
        backbones={"tiny": {"pretrained": str(tiny_bert)}},
        tasks={task: rows},
        data={**workflow_settings().config["data"], "selection_fraction": selection_fraction},
        baseline={"settings": {"batch_size": 8}},
        peers=peers,
    )


def run(settings, task: str, peer: str, data: Path, out: Path, seed: int) -> dict:
    run_peer(get_task(task), "tiny", settings.peer("tiny", task, peer), CPU, data / "tokens", data / "raw", out, seed,
             threads=1)  # fmt: skip
    return json.loads((out / PEER_METRICS).read_text())


def kept(record: dict) -> dict:
    """The entry of ``tried`` with the best selection score."""
    return max(record["tried"], key=lambda t: t["selection"])


def epoch_scores(record: dict) -> list[list[float]]:
    """Each tried run's selection score after each epoch (the seconds beside them differ in any two runs)."""
    return [[h["selection"]["pearson"] for h in t["history"]] for t in record["tried"]]


def test_lora_and_bitfit_keep_the_run_and_epoch_best_on_selection(tiny_bert, tmp_path):
    """Two learning rates, three epochs each, on STS-B: the record keeps the rate and the epoch
    best on selection, its selection metrics are those of that epoch's weights (reloaded, not the
    last epoch's), its seconds the kept epoch's; the grid's rates and the job's seed reach the runs
    (each changes the scores); LoRA and BitFit leave their own parameters trainable."""
    peers = {
        "lora": {"rank": 4, "learning_rates": [1e-3, 1e-2], "epochs": 3},
        "bitfit": {"learning_rates": [1e-3, 1e-2], "epochs": 3},
    }
    settings = peer_settings(tiny_bert, "stsb", {"train_size": 60, "eval_size": 30}, peers)
    data = download_and_tokenize(settings, "tiny", "stsb", tmp_path / "data")
    records = {
        (peer, seed): run(settings, "stsb", peer, data, tmp_path / f"{peer}{seed}", seed)
        for peer, seed in (("lora", 1), ("lora", 2), ("bitfit", 1))
    }
    for (peer, seed), record in records.items():
        assert (record["peer"], record["seed"], record["deterministic"]) == (peer, seed, False)
        tried = record["tried"]
        assert [t["learning_rate"] for t in tried] == [1e-3, 1e-2]
        for t in tried:
            scores = [h["selection"]["pearson"] for h in t["history"]]
            assert t["best_epoch"] == int(np.argmax(scores)) + 1 and t["selection"] == max(scores)
        best = kept(record)
        assert record["chosen"] == {"learning_rate": best["learning_rate"], "epoch": best["best_epoch"]}
        assert record["selection_score"] == pytest.approx(best["selection"], abs=1e-6)
        assert record["train_seconds"] == best["history"][best["best_epoch"] - 1]["train_seconds"]
        assert set(record["metrics"]) == {"selection", "dev"}
        # the grid's rates train differently
        assert tried[0]["history"][0]["selection"] != tried[1]["history"][0]["selection"]
    assert min(t["selection"] for t in records["lora", 1]["tried"]) < records["lora", 1]["selection_score"]
    # an epoch before the last is kept here: its weights, not the last epoch's, are scored
    assert records["lora", 1]["chosen"]["epoch"] < 3
    # the seed reaches the runs (the initial head and adapters, the batch order)
    assert epoch_scores(records["lora", 1]) != epoch_scores(records["lora", 2])
    # 2 layers x (query, value) x (A: 32 x 4 + B: 4 x 32) and the 1-output head (32 + 1); BitFit:
    # every bias of the encoder and the head
    assert records["lora", 1]["trainable_parameters"] == 2 * 2 * (32 * 4 + 4 * 32) + 33
    from transformers import AutoModel

    biases = sum(p.numel() for n, p in AutoModel.from_pretrained(tiny_bert).named_parameters() if n.endswith(".bias"))
    assert records["bitfit", 1]["trainable_parameters"] == biases + 33


def test_setfit_keeps_the_learning_rate_best_on_selection(tiny_bert, tmp_path):
    """Two body learning rates on SST-2: the kept one is the best on selection and the record's
    selection score is its model's on the selection split (never dev's); the rates and the seed
    reach the contrastive training; the trainable parameters are the encoder's that the embedding
    reads (not BERT's pooler) and the logistic head's."""
    from transformers import AutoModel

    peers = {"setfit": {"learning_rates": [1e-4, 1e-2], "pairs_per_example": 2, "max_pair_steps": 4, "batch_size": 8}}
    settings = peer_settings(tiny_bert, "sst2", {"train_size": 40, "eval_size": 40}, peers, selection_fraction=0.5)
    data = download_and_tokenize(settings, "tiny", "sst2", tmp_path / "data")
    records = {seed: run(settings, "sst2", "setfit", data, tmp_path / f"setfit{seed}", seed) for seed in (1, 2)}
    for record in records.values():
        best = kept(record)
        assert record["chosen"] == {"learning_rate": best["learning_rate"]}
        assert record["selection_score"] == record["metrics"]["selection"]["accuracy"] == best["selection"]
        assert record["label"] == "SetFit" and set(record["metrics"]) == {"selection", "dev"}
    tried = records[2]["tried"]
    assert [t["learning_rate"] for t in tried] == [1e-4, 1e-2] and tried[0]["selection"] != tried[1]["selection"]
    assert [t["selection"] for t in records[1]["tried"]] != [t["selection"] for t in tried]
    encoder = AutoModel.from_pretrained(tiny_bert)
    bare = sum(p.numel() for n, p in encoder.named_parameters() if not n.startswith("pooler."))
    assert records[1]["trainable_parameters"] == bare + 32 + 1  # one logistic regression's weights and intercept
    assert records[1]["encoder_parameters"] == sum(p.numel() for p in encoder.parameters())


def stsb_raw(tmp_path: Path) -> Path:
    from tests.test_peers import stsb_rows

    raw = tmp_path / "raw"
    raw.mkdir()
    for split, frame in {"train": stsb_rows(30), "selection": stsb_rows(10, 30), "dev": stsb_rows(10, 40)}.items():
        frame.to_parquet(split_file(raw, split))
    return raw


def test_the_embedding_peers_record_its_kept_fit_on_the_shared_encoding(tiny_bert, tmp_path):
    """Read from the task's shared encoding: the record's selection score is the kept fit's score
    in ``tried`` (each fit scored on selection, not train), its seconds the encoding's and that fit's,
    its label and determinism the registry's."""
    from bertvision.stages.peer import embed_task
    from tests.test_peers import settings_of

    task, raw = get_task("stsb"), stsb_raw(tmp_path)
    shared = {"batch_size": 8, "max_length": 64, "backend": "torch"}
    encoding = tmp_path / "embeddings.npz"
    embed_task(task, "tiny", settings_of(tiny_bert, {"method": "cosine", **shared}), CPU, raw, encoding)
    with np.load(encoding) as saved:
        encode_seconds = json.loads(str(saved["encoding"]))["encode_seconds"]
    linear = settings_of(tiny_bert, {"method": "embedding", "regularization": [0.1, 1.0, 10.0], **shared})
    out = tmp_path / "peer"
    run_peer(task, "tiny", linear, CPU, tmp_path, raw, out, 0, threads=1, embeddings=encoding)
    record = json.loads((out / PEER_METRICS).read_text())
    assert (record["label"], record["deterministic"], record["shared_encoding"]) == ("embedding + linear", True, True)
    entry = next(t for t in record["tried"] if {k: t[k] for k in record["chosen"]} == record["chosen"])
    assert entry["selection"] == max(t["selection"] for t in record["tried"])
    assert record["selection_score"] == pytest.approx(entry["selection"], abs=1e-12)
    assert record["train_seconds"] == pytest.approx(encode_seconds + entry["fit_seconds"], abs=1e-9)


def test_a_peer_job_on_a_task_it_does_not_apply_to_fails_naming_why(tiny_bert, tmp_path):
    from tests.test_peers import settings_of

    settings = settings_of(tiny_bert, {"method": "embedding", "regularization": [1.0], "batch_size": 8,
                                       "max_length": 64, "backend": "torch"})  # fmt: skip
    squad = get_task("squad2")
    with pytest.raises(ValueError, match="peer embedding does not apply to task squad2: a question task"):
        run_peer(squad, "tiny", settings, CPU, tmp_path, tmp_path, tmp_path / "out", 0)
    assert not (tmp_path / "out").exists()


def test_the_cosine_needs_two_texts_and_a_regression():
    """A regression over one text (a task of the config's own) has no pair to take the cosine of."""
    single = dataclasses.replace(get_task("stsb"), name="one-text", text_fields=("sentence1",))
    assert applicable(["embedding", "cosine"], single) == ["embedding"]
    assert "text pairs only" in inapplicable(["cosine"], single)["cosine"]


def test_loras_dropout_and_an_answerability_tasks_head(tiny_bert):
    """The configured dropout reaches the adapters; an answerability task (one window of a
    question, classified) adapts as a sequence classifier, its classifier trained whole."""
    import torch

    from bertvision.config.settings import LoraPeer
    from bertvision.peers.adapted import lora, trainable_parameters
    from bertvision.training.encoder import load_classifier

    settings = LoraPeer(method="lora", rank=4, alpha=8, dropout=0.25, target_modules=("query", "value"),
                        learning_rates=(1e-3,), epochs=1)  # fmt: skip
    task = get_task("squad2-answerable")
    adapted = lora(settings, task)(load_classifier(task, str(tiny_bert), seed=1))
    config = adapted.peft_config["default"]
    assert (config.lora_dropout, config.task_type) == (0.25, "SEQ_CLS")
    dropouts = [m.p for n, m in adapted.named_modules() if "lora_dropout" in n and isinstance(m, torch.nn.Dropout)]
    assert dropouts and set(dropouts) == {0.25}
    head = [n for n, p in adapted.named_parameters() if p.requires_grad and "classifier" in n]
    assert head and trainable_parameters(adapted) == 2 * 2 * (32 * 4 + 4 * 32) + (32 * 2 + 2)
