"""Whether a bundle served on another backend than the one its heads' states came from (``serve
--backend``) answers as its heads were trained to. Every head of a text task runs on the same probe
texts through the bundle's own backend and precision and through the one asked for; a head whose
outputs move by more than ``MOVED_LIMIT`` of their spread over the probes is left out, and a
task's picked head is refused in one line. int8 weights move the [CLS] state of an encoder's
first layers, which barely varies from text to text, by thousands of times its spread: a head
that reads it answered one class for every SST-2 sentence. Question tasks are not probed (their
windows need a context)."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from bertvision.serving.bundle import BundleError
from bertvision.serving.items import TextItem

log = logging.getLogger(__name__)

PROBES, PROBE_WORDS = 32, 12
# a head's outputs may move by half their spread over the probes (mean over probes and outputs):
# ONNX fp32 moved them 0.09 at most (a bf16 bundle's), int8 the mean readers 0.11 to 0.21 and the
# [CLS] readers 457 to 6,294 (docs/results/onnx-backend-check-amd-epyc.txt)
MOVED_LIMIT = 0.5


def probe_texts(tokenizer, seed: int = 0) -> list[str]:
    """``PROBES`` texts of ``PROBE_WORDS`` words drawn from the tokenizer's whole-word vocabulary
    (the bundle holds no data): they reach every state a real text does, nonsense or not."""
    # a byte-level or SentencePiece vocabulary marks a word's start (Ġ, ▁): its words are those, less
    # the mark; a word-piece one marks a piece inside a word instead (##ing), left out by isalpha
    vocab = tokenizer.get_vocab()
    starts = {w[1:] for w in vocab if w[:1] in ("Ġ", "▁")}
    words = sorted(w for w in (starts or vocab) if w.isalpha() and w.islower() and len(w) > 2) or ["text"]
    picks = np.random.default_rng(seed).choice(len(words), size=(PROBES, PROBE_WORDS))
    return [" ".join(words[i] for i in row) for row in picks]


def probe_items(engine, texts: list[str]) -> list[TextItem]:
    """One item per probe text, task text field and head of every text task of ``engine``'s bundle."""
    pairs = list(zip(texts, texts[1:] + texts[:1]))
    items = []
    for task in engine.tasks.values():
        if task.takes_questions:
            continue
        for head in task.heads:
            items += [TextItem(pair[: len(task.text_fields)], {task.name: head}) for pair in pairs]
    return items


def outputs_by_head(engine, items: list[TextItem]) -> dict[tuple[str, str], np.ndarray]:
    results = engine.predict(items)[0]
    by_head: dict[tuple[str, str], list] = {}
    for item, answer in zip(items, results):
        ((task, head),) = item.heads.items()
        by_head.setdefault((task, head), []).append(answer[task].outputs)
    return {key: np.asarray(rows, dtype=np.float64) for key, rows in by_head.items()}


def moved_outputs(engine, reference_encoder, reference_precision: str) -> dict[tuple[str, str], float]:
    """Per (task, head): how far ``engine``'s outputs on the probes lie from those of
    ``reference_encoder`` in ``reference_precision`` (the bundle's own), in the reference outputs'
    spread over the probes (mean absolute difference / mean standard deviation)."""
    items = probe_items(engine, probe_texts(engine.tokenizer))
    if not items:
        return {}
    served = outputs_by_head(engine, items)
    encoder, precision = engine.encoder, engine.precision
    engine.encoder, engine.precision = reference_encoder, reference_precision
    try:
        reference = outputs_by_head(engine, items)
    finally:
        engine.encoder, engine.precision = encoder, precision
    return {
        key: float(np.abs(served[key] - ref).mean() / max(ref.std(axis=0).mean(), 1e-12))
        for key, ref in reference.items()
    }


def heads_served_on(engine, reference_encoder, reference_precision: str, backend: str):
    """``engine``'s bundle less the heads whose answers ``backend`` moves (``moved_outputs`` beyond
    ``MOVED_LIMIT``), each named in the log; a task's picked head among them is refused in one
    line, naming the backend its heads were trained on."""
    moved = moved_outputs(engine, reference_encoder, reference_precision)
    shown = {f"{t}/{h}": round(v, 4) for (t, h), v in moved.items()}
    log.info("--backend %s against the bundle's %s: outputs moved by %s of their spread on %d probe texts",
             backend, engine.bundle.backend, shown, PROBES)  # fmt: skip
    too_far = {key: v for key, v in moved.items() if v > MOVED_LIMIT}
    picked = {f"{t}/{h} by {v:.3g}" for (t, h), v in too_far.items() if engine.tasks[t].picked == h}
    if picked:
        raise BundleError(
            f"{engine.bundle.root}: --backend {backend} moves the answers of {', '.join(sorted(picked))} times their "
            f"spread over {PROBES} probe texts (at most {MOVED_LIMIT}): serve it with --backend "
            f"{engine.bundle.backend}, which its heads were trained on"
        )
    if not too_far:
        return engine.bundle
    log.warning("--backend %s leaves out the heads whose answers it moves (times their spread): %s",
                backend, {f"{t}/{h}": round(v, 1) for (t, h), v in too_far.items()})  # fmt: skip
    tasks = {
        name: replace(task, heads={h: e for h, e in task.heads.items() if (name, h) not in too_far})
        for name, task in engine.tasks.items()
    }
    return replace(engine.bundle, tasks=tasks)
