"""What the serving engine takes and gives, and its batch bookkeeping: request items, results,
the errors a request can raise (each naming its field), the distinct token sequences of a batch
and what one encoder pass leaves for the heads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bertvision.data.tokenized import TokenizedSplit


class RequestError(ValueError):
    """Input the service cannot answer; ``field`` names the request field at fault."""

    def __init__(self, field: str, message: str, status: int = 422):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.status = field, message, status


@dataclass(frozen=True)
class TextItem:
    """One example (a text, or a pair) and the head to apply for each of its tasks."""

    texts: tuple[str, ...]
    heads: dict[str, str]  # task -> head


@dataclass(frozen=True)
class QuestionItem:
    """One question about a context, and the head to apply for each of its span tasks."""

    question: str
    context: str
    heads: dict[str, str]


@dataclass
class ExampleResult:
    head: str
    outputs: list[float | None]
    label: str | None = None  # classification
    label_id: int | None = None
    probabilities: dict[str, float] | None = None
    score: float | None = None  # regression


@dataclass
class SpanResult:
    head: str
    answer: str  # "" when the question is judged unanswerable
    has_answer: bool
    best_span: str  # the best span, whatever the threshold says
    score_diff: float | None  # best span score - null score (None: no valid span)
    null_threshold: float


def finite(x: float) -> float | None:
    """JSON has no inf or nan."""
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class TextFields:
    """What ``tokenize_frame`` reads of a task: its text columns."""

    text_fields: tuple[str, ...]


SINGLE, PAIR = TextFields(("text",)), TextFields(("text", "text_pair"))


class Sequences:
    """The distinct token sequences of a batch (identical ones share a row)."""

    def __init__(self):
        self.rows: dict[tuple[bytes, bytes], int] = {}
        self.input_ids: list[np.ndarray] = []
        self.token_type_ids: list[np.ndarray] = []

    def add(self, input_ids: np.ndarray, token_type_ids: np.ndarray) -> int:
        key = (np.asarray(input_ids, np.int32).tobytes(), np.asarray(token_type_ids, np.int8).tobytes())
        if key not in self.rows:
            self.rows[key] = len(self.input_ids)
            self.input_ids.append(np.asarray(input_ids, np.int32))
            self.token_type_ids.append(np.asarray(token_type_ids, np.int8))
        return self.rows[key]

    def __len__(self) -> int:
        return len(self.input_ids)

    def split(self, token_types: bool) -> TokenizedSplit:
        """The sequences as a split; ``token_types``: whether the encoder takes token type ids."""
        n = len(self)
        frame = pd.DataFrame(
            {
                "idx": np.arange(n),
                "input_ids": self.input_ids,
                "token_type_ids": self.token_type_ids,
                "length": np.array([len(x) for x in self.input_ids], dtype=np.int64),
                "label": np.zeros(n, np.int64),
            }
        )
        return TokenizedSplit(frame if token_types else frame.drop(columns="token_type_ids"))


@dataclass
class Encoded:
    """A batch's features: per-example states of every layer for every row ('cls' and 'mean',
    float16, as stored), and the outputs of the heads that read every token, computed chunk by
    chunk as the encoder runs (span heads: per window, (tokens, 2) logits; token-level example
    heads: per example)."""

    example_states: dict[str, np.ndarray]  # reads ('cls', 'mean') -> (rows, layers, hidden) float16
    token_outputs: dict[tuple[str, str], dict[int, np.ndarray]]  # (task, head) -> row -> outputs
    bert_logits: dict[int, np.ndarray] = field(default_factory=dict)  # row -> the task model's own outputs


@dataclass
class SpanGroup:
    """The windows of the questions asking span tasks with one (max_length, doc_stride)."""

    tasks: list[str]
    questions: list[int]  # item positions; a window's ``idx`` indexes this list
    windows: TokenizedSplit
    rows: list[int]  # each window's row in the batch's Sequences
