"""What differs between task kinds lives in a "problem": per-example features, [CLS] or mean
states (classification, regression), every real token of each example (token-level heads), or
per-token features of context windows (span). ``Problems`` builds each once per checkpoint,
over its stored features (a manifest) or streamed from its frozen encoder (a StreamSource)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bertvision.config.settings import HeadRuntimeSettings
from bertvision.features.source import StreamSource
from bertvision.features.streamed import open_split, streamed_encoder
from bertvision.registry.heads import head_states, is_token_head
from bertvision.registry.task_spec import TaskSpec, splits_of
from bertvision.runtime.device import pick_device
from bertvision.training.example import ExampleProblem
from bertvision.training.span import SpanProblem
from bertvision.training.tokens import TokenExampleProblem

PROBLEMS = {"classification": ExampleProblem, "regression": ExampleProblem, "span": SpanProblem}


def problem_class(task: TaskSpec, spec: dict):
    """The problem head ``spec`` trains on: token-level heads of example tasks on every real
    token (``TokenExampleProblem``), the others by task kind (``PROBLEMS``)."""
    if is_token_head(spec) and task.kind != "span":
        return TokenExampleProblem
    return PROBLEMS[task.kind]


class Problems:
    """The training problems over one checkpoint's features, one per problem class (per-example
    [CLS] or mean, token-level, span), each built (and its input moments computed) when a head first
    needs it. ``in_memory_max_mb``: heads.training.in_memory_max_mb."""

    def __init__(
        self,
        task: TaskSpec,
        source: Path | StreamSource,
        runtime: HeadRuntimeSettings,
        in_memory_max_mb: float,
        raw_dir=None,
        train_fraction: float = 1.0,
    ):
        self.task, self.raw_dir, self.train_fraction = task, raw_dir, train_fraction
        self.in_memory_max_mb = in_memory_max_mb
        self.streamed = isinstance(source, StreamSource)
        # streamed: the heads train where the encoder runs (the extraction's device)
        self.device = streamed_encoder(source).device if self.streamed else pick_device(runtime.device)
        self.feats = {split: open_split(source, split, verify=runtime.verify) for split in splits_of(task)}
        self.encoder = streamed_encoder(source) if self.streamed else None
        # the checkpoint the states come from (heads initialised from the encoder's own layers)
        self.encoder_dir = self.feats["train"].manifest.get("encoder_dir")
        self._problems: dict = {}
        self._moments: dict = {}
        self._label_moments: dict = {}

    def _key(self, spec: dict) -> tuple:
        """What tells two heads' problems apart: the problem class and the stored states a
        per-example head reads ('cls' or 'mean', of the joint pair or, 'apart-cls' and 'apart-mean',
        its texts encoded apart: ``registry.heads.head_states``; token-level heads and span tasks
        read every token)."""
        cls = problem_class(self.task, spec)
        return cls, head_states(spec) if cls is ExampleProblem else "tokens"

    def get(self, spec: dict):
        key = self._key(spec)
        if key not in self._problems:
            cls, reads = key
            feats = self.feats if reads == "tokens" else {s: f.reading(reads) for s, f in self.feats.items()}
            self._problems[key] = cls(
                self.task, feats, self.device, self.in_memory_max_mb, self.raw_dir, self.train_fraction
            )
        return self._problems[key]

    def moments(self, spec: dict):
        """(mean, std) of the training features ``spec``'s problem sees."""
        key = self._key(spec)
        if key not in self._moments:
            self._moments[key] = self.get(spec).moments()
        return self._moments[key]

    def label_moments(self, spec: dict):
        """(mean, std) of a regression's training labels (the rows ``spec``'s problem trains on),
        in whose standard units its heads output; None for other tasks."""
        if self.task.kind != "regression":
            return None
        key = self._key(spec)
        if key not in self._label_moments:
            labels = np.asarray(self.get(spec).train_labels(), dtype=np.float64)
            self._label_moments[key] = float(labels.mean()), float(labels.std()) if len(labels) > 1 else 1.0
        return self._label_moments[key]
