"""What an extraction stores per example, without importing torch: each layer's state pooled one
of two ways (``READS``) from a pair read in one of two forms (``PAIR_FORMS``), a pair encoded apart
giving SBERT's features of its two texts (``PAIR_PARTS``). Heads read these by name
(``registry.heads``), the feature stores hold them (``features``)."""

from __future__ import annotations

from dataclasses import dataclass

# How a pair task's two texts reach the frozen encoder for a per-example head (its ``pair``): as
# one sequence ([CLS] a [SEP] b, a cross-encoder's input, BERT's way) or each text alone, as a
# sentence-transformers bi-encoder was trained. A task's extraction stores every form one of its
# heads reads, and selection chooses among the heads like among any (``reporting.ranking``).
PAIR_FORMS = ("joint", "apart")

# What a pair encoded apart gives its heads per layer, in this order along the hidden axis:
# SBERT's classification features of the two texts' states u and v.
PAIR_PARTS = ("u", "v", "|u-v|", "u*v")

# What a per-example head reads of each layer: its [CLS] (summary-token) state, or the mean of
# its real tokens' states (the pooling sentence-transformers backbones are trained with). Both
# are stored by every extraction; token-level heads read every token and pool it themselves.
READS = ("cls", "mean")


@dataclass(frozen=True)
class States:
    """Per-example states an extraction stores: a pooling (``READS``) of a pair form (``PAIR_FORMS``)."""

    reads: str
    pair: str = "joint"

    @property
    def name(self) -> str:
        """The feature shard's dataset and the manifest's ``reads`` entry: 'cls', 'mean', 'apart-cls', 'apart-mean'."""
        return self.reads if self.pair == "joint" else f"{self.pair}-{self.reads}"

    def width(self, hidden: int) -> int:
        """The width per layer for an encoder ``hidden`` wide: a pair's apart form holds PAIR_PARTS."""
        return len(PAIR_PARTS) * hidden if self.pair == "apart" else hidden


# Every kind of stored per-example states, by name, joint before apart.
STATES = {s.name: s for s in (States(reads, pair) for pair in PAIR_FORMS for reads in READS)}


def states_name(reads: str, pair: str = "joint") -> str:
    """The stored per-example states of this pooling and pair form (``States.name``)."""
    return States(reads, pair).name
