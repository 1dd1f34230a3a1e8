"""The peer registry: the methods a practitioner would use instead of the BERTVision path, each
a row of every summary beside full fine-tuning (config ``peers``), without importing torch.
Each entry says which task kinds it applies to (and, for the others, why not in one line),
whether its result depends on the seed, and how it is named in the tables. The stage that runs
them is ``stages/peer.py``; adding a peer is one entry here and one function there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bertvision.registry.task_spec import TaskSpec


@dataclass(frozen=True)
class PeerMethod:
    name: str
    label: str  # the summary's row name
    description: str
    # the reason the method does not apply to a task, or None when it does
    inapplicable: Callable[[TaskSpec], str | None]
    # the same result whatever the seed (no random initialisation, no shuffling): one run stands
    # for every seed, its spread zero by construction
    deterministic: bool = False
    # trains the encoder (its whole cost is a training job); else the encoder only encodes
    trains_encoder: bool = False

    @property
    def reads_embeddings(self) -> bool:
        """Reads the task's sentence embeddings, encoded once for every such peer (rule embed)."""
        return not self.trains_encoder


def _sentence_embedding(task: TaskSpec) -> str | None:
    if task.windowed:
        return (
            "a question task reads answers off token positions or windows of a context, which one "
            "sentence embedding per text does not hold"
        )
    return None


def _cosine(task: TaskSpec) -> str | None:
    if reason := _sentence_embedding(task):
        return reason
    if task.kind != "regression" or len(task.text_fields) != 2:
        return "the cosine of two embeddings scores a similarity regression over text pairs only"
    return None


def _any_task(task: TaskSpec) -> str | None:
    return None


def _setfit(task: TaskSpec) -> str | None:
    if task.windowed or task.kind != "classification" or len(task.text_fields) != 1:
        return "SetFit's contrastive pairs and logistic head are for single-text classification only"
    return None


PEERS: dict[str, PeerMethod] = {
    p.name: p
    for p in (
        PeerMethod(
            "embedding",
            "embedding + linear",
            "the backbone's own sentence embedding (its declared pooling), each text encoded once, and a "
            "logistic regression (classification) or ridge regression (regression) on it, pairs as SBERT's "
            "[u, v, |u-v|, u*v]; the regularisation chosen on selection; no fine-tuning",
            _sentence_embedding,
            deterministic=True,
        ),
        PeerMethod(
            "cosine",
            "embedding cosine",
            "the cosine of the two texts' sentence embeddings as the similarity score: no training at all",
            _cosine,
            deterministic=True,
        ),
        PeerMethod(
            "lora",
            "LoRA",
            "low-rank adapters on the encoder's attention (peft) and BERT's classification head, the learning "
            "rate and epoch chosen on selection",
            _any_task,
            trains_encoder=True,
        ),
        PeerMethod(
            "bitfit",
            "BitFit",
            "the encoder's biases and BERT's classification head trained, every other weight frozen; the "
            "learning rate and epoch chosen on selection",
            _any_task,
            trains_encoder=True,
        ),
        PeerMethod(
            "setfit",
            "SetFit",
            "contrastive fine-tuning of the sentence encoder on a bounded number of pairs, then a logistic "
            "head on its embeddings (the setfit library); the learning rate chosen on selection",
            _setfit,
            trains_encoder=True,
        ),
    )
}


def get_peer(name: str) -> PeerMethod:
    try:
        return PEERS[name]
    except KeyError:
        raise KeyError(f"unknown peer method {name!r}; known: {', '.join(PEERS)}") from None


def applicable(names, task: TaskSpec) -> list[str]:
    """The peers of ``names`` that apply to ``task``, in the given order."""
    return [n for n in names if get_peer(n).inapplicable(task) is None]


def inapplicable(names, task: TaskSpec) -> dict[str, str]:
    """Peer name -> why it does not apply to ``task``, for those of ``names`` that do not."""
    return {n: why for n in names if (why := get_peer(n).inapplicable(task))}
