"""The head registry: every head type a config may name, with its options, without importing
torch. Each entry's ``nn.Module`` class (in ``bertvision.models``) names it with ``@builds(name)``
and is built as ``cls(layers, hidden, outputs, **options)``.

Adding a head is one ``@builds``-decorated class in ``bertvision/models/heads.py`` (or
``cnn_heads.py``) plus one ``register(HeadType(...))`` here: the config schema (the type names, each
type's options with their defaults and ranges), the optuna search space and head training all
follow from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bertvision.registry.states import PAIR_FORMS, READS, states_name


@dataclass(frozen=True)
class Option:
    """One constructor argument of a head class, as the config sets it."""

    type: type  # bool, int, float or str
    default: object
    help: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    searchable: bool = False  # the optuna search may choose it (search.space)

    def typed(self, value):
        """``value`` as this option's type where JSON Schema let another number through: an
        integer option written 64.0 (an integer to JSON Schema) is 64, not a float that a
        tensor's size refuses in the job."""
        return int(value) if self.type is int and isinstance(value, float) and value.is_integer() else value

    def json_schema(self) -> dict:
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[self.type]
        schema = {"type": kind, "default": self.default, "description": self.help}
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        return schema


@dataclass(frozen=True)
class HeadType:
    name: str
    help: str
    options: dict[str, Option] = field(default_factory=dict)
    # Trained on every real token of an example (tasks with token_features), with a padding mask.
    token_level: bool = False
    # Reads a whole padded sequence with its mask (``forward(x, mask, per_token)``): per example,
    # or per token for span tasks, whose windows it then also trains on.
    sequence: bool = False
    # Reads the two sides of a pair encoded apart (PAIR_PARTS) only: trains only on pair tasks.
    pair_apart: bool = False
    # Training seconds per example relative to an adapter of width 64 (measured on [CLS] states
    # of MiniLM on a CPU): sizes the runtime each head-training job asks the scheduler for.
    relative_cost: float = 1.0
    # What keeps options that each pass their range from building a head on states ``hidden``
    # wide (``misfit(options, hidden)``, the words of the problem, or None): checked where the
    # config is read, for each backbone whose width is known there, and again where it is built.
    misfit: Callable[[dict, int], str | None] | None = None


# BERT's own head (its task model's classifier): its name in the tables, which no head may take
BERT_HEAD = "BERT"

HEAD_TYPES: dict[str, HeadType] = {}
# The nn.Module class each head type builds, filled by ``builds`` where the class is defined
# (bertvision/models), so that this registry, which the config reads, never imports torch.
HEAD_CLASSES: dict[str, type] = {}

# Training settings the search may choose for every head (heads.training), with their types.
SEARCHABLE_TRAINING = {"learning_rate": float, "weight_decay": float, "batch_size": int, "max_epochs": int}


def register(head_type: HeadType) -> HeadType:
    if head_type.name in HEAD_TYPES:
        raise ValueError(f"head type {head_type.name!r} registered twice")
    clash = sorted(set(head_type.options) & (set(SEARCHABLE_TRAINING) | {"type", "reads", "pair"}))
    if clash:
        raise ValueError(f"head type {head_type.name!r}: options {clash} clash with training settings")
    HEAD_TYPES[head_type.name] = head_type
    return head_type


def builds(name: str):
    """Class decorator: the ``nn.Module`` a registered head type is built as,
    ``cls(layers, hidden, outputs, **options)``."""

    def add(cls: type) -> type:
        get_head_type(name)
        if name in HEAD_CLASSES:
            raise ValueError(f"head type {name!r} built by both {HEAD_CLASSES[name].__name__} and {cls.__name__}")
        HEAD_CLASSES[name] = cls
        return cls

    return add


def get_head_type(name: str) -> HeadType:
    try:
        return HEAD_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown head type {name!r}; known: {', '.join(HEAD_TYPES)}") from None


PAIR_OPTION = Option(
    str,
    "joint",
    "Pair tasks: the pair as one sequence (joint), or each text encoded alone (apart), the head "
    "then reading per layer [u, v, |u-v|, u*v] of the two texts' states. Single-text tasks do not "
    "train an apart head.",
    choices=PAIR_FORMS,
)
READS_OPTION = Option(
    str,
    "cls",
    "The per-example states of every layer this head reads: the summary token's ([CLS], <s>), or "
    "the mean over the example's real tokens (a bi-encoder backbone's own pooling).",
    choices=READS,
)


def head_options(head_type: HeadType) -> dict[str, Option]:
    """Every key a spec of ``head_type`` may set besides ``type``: its constructor options, and
    ``reads`` and ``pair`` for the per-example heads (``pair`` but for the heads that read a pair
    apart only)."""
    if head_type.token_level:
        return head_type.options
    return {**head_type.options, "reads": READS_OPTION, **({} if head_type.pair_apart else {"pair": PAIR_OPTION})}


def complete_spec(spec: dict) -> dict:
    """``spec`` ({"type": ..., options}) with every option its type has, defaults filled in."""
    head_type = get_head_type(spec["type"])
    options = head_options(head_type)
    unknown = sorted(set(spec) - {"type"} - set(options))
    if unknown:
        raise ValueError(f"head type {head_type.name!r} has no option(s) {unknown}; it has {sorted(options)}")
    given = {k: options[k].typed(v) for k, v in spec.items() if k != "type"}
    return {"type": head_type.name, **{k: o.default for k, o in options.items()}, **given}


def head_reads(spec: dict) -> str:
    """'cls' or 'mean' for a per-example head (``READS``); 'tokens' for a token-level one."""
    if is_token_head(spec):
        return "tokens"
    return spec.get("reads", READS_OPTION.default)


def head_pair(spec: dict) -> str:
    """How a pair task's two texts reach the encoder for this head (``PAIR_FORMS``); 'joint' for a
    token-level head (it reads the joint sequence's tokens)."""
    head_type = get_head_type(spec["type"])
    if head_type.pair_apart:
        return "apart"
    return "joint" if head_type.token_level else spec.get("pair", PAIR_OPTION.default)


def head_states(spec: dict) -> str:
    """The stored states a per-example head reads (``states_name``); 'tokens' for a token-level one."""
    reads = head_reads(spec)
    return reads if reads == "tokens" else states_name(reads, head_pair(spec))


def constructor_options(spec: dict) -> dict:
    """The keys of ``spec`` its head class is built with (``reads`` and ``pair`` pick its input, not its shape)."""
    return {k: v for k, v in complete_spec(spec).items() if k not in ("type", "reads", "pair")}


def shape_problem(spec: dict, hidden: int) -> str | None:
    """Why a head of ``spec`` cannot be built on states ``hidden`` wide, or None."""
    misfit = get_head_type(spec["type"]).misfit
    return misfit(constructor_options(spec), hidden) if misfit else None


def is_token_head(spec: dict) -> bool:
    """Whether a head of ``spec["type"]`` needs every token's features, not only [CLS]."""
    return get_head_type(spec["type"]).token_level


def trains_on(spec: dict, task_kind: str, token_features: bool, apart: bool = False) -> bool:
    """Whether a head of ``spec["type"]`` can train on a task of ``task_kind`` ('span' or an
    example kind) that stores every token's states (``token_features``; span tasks always do).
    A head that reads the mean over an example's tokens has no per-token form for span tasks; a
    head that reads a pair's two texts apart needs a task whose pairs can be (``apart``: two
    texts, stored states)."""
    head_type = get_head_type(spec["type"])
    if head_pair(spec) == "apart" and (not apart or task_kind == "span"):
        return False
    if task_kind == "span":  # per-token outputs: a sequence head, or a per-example head applied to each token
        return head_type.sequence or (not head_type.token_level and head_reads(spec) == "cls")
    return token_features or not head_type.token_level


def searched_parameters(space: dict, head_type: str) -> list[str]:
    """The parameters of a search ``space`` a head of ``head_type`` takes: the training settings,
    and its own options that it marks searchable (another type's searchable option of the same
    name is not this one's)."""
    options = get_head_type(head_type).options
    return [name for name in space if name in SEARCHABLE_TRAINING or (name in options and options[name].searchable)]


def searchable_parameters() -> dict[str, type]:
    """Every parameter the search space may name: training settings and head options."""
    out = dict(SEARCHABLE_TRAINING)
    for head_type in HEAD_TYPES.values():
        out.update({name: o.type for name, o in head_type.options.items() if o.searchable})
    return out


DROPOUT = Option(float, 0.0, "Dropout before the output layer.", minimum=0, maximum=1, searchable=True)

register(
    HeadType(
        "lp",
        "Learned pooling (ScalarMix): gamma * sum_l softmax(w)_l X[l], then a linear layer.",
        {"dropout": DROPOUT},
    )
)
register(
    HeadType(
        "mean",
        "Average pooling (AP): the mean over layers, then a linear layer.",
        {"dropout": DROPOUT},
    )
)
register(
    HeadType(
        "adapter",
        "AdapterPooler: GELU(W X[l] + b) per layer, flattened, then a linear layer.",
        {
            "width": Option(int, 64, "Adapter width A (W is A x hidden).", minimum=1, searchable=True),
            "shared": Option(bool, True, "One W for every layer (true) or one per layer (false)."),
            "skip": Option(bool, False, "Concatenate the last layer's state before the output layer."),
            "dropout": DROPOUT,
        },
    )
)
register(
    HeadType(
        "token-pool",
        "Every real token of an example (tasks with token_features): a layer mix per token, then "
        "position-free pooling over the real tokens, then a linear layer.",
        {
            "pool": Option(
                str,
                "attention-mean",
                "How the real tokens are pooled: attention (learned query) "
                "and masked mean concatenated, or one of them.",
                choices=("attention-mean", "attention", "mean"),
            ),
            "dropout": DROPOUT,
        },
        token_level=True,
    )
)

register(
    HeadType(
        "cosine",
        "A pair's two texts encoded apart: one learned layer mix of each text's states, "
        "the cosine of the two, then a linear layer (a scale and an offset for a similarity regression).",
        {
            "residual": Option(
                int,
                0,
                "0: the cosine alone. A > 0: plus a correction, a shared AdapterPooler of width A over "
                "each layer's |u-v| and u*v (the parts a swap of the texts leaves as they are) whose output "
                "layer starts at zero, so that training starts from the fitted cosine.",
                minimum=0,
                searchable=True,
            ),
            "dropout": DROPOUT,
        },
        pair_apart=True,
    )
)

# The front of the convolutional heads: what their 1xN "image" is (channels x width).
# Xception's narrowest width: every BatchNorm then sees at least 2 positions, so a training batch
# of one example works.
XCEPTION_MIN_WIDTH = 15


def _xception_misfit(options: dict, hidden: int) -> str | None:
    if (options["adapter_width"] or hidden) >= XCEPTION_MIN_WIDTH:
        return None
    given = f"adapter_width {options['adapter_width']}" if options["adapter_width"] else f"hidden size {hidden}"
    return (
        f"its strided convolutions need a width of at least {XCEPTION_MIN_WIDTH} (the hidden size, "
        f"or adapter_width when set), got {given}"
    )


def ladder_width(hidden: int, reduction: int) -> int:
    return max(1, hidden // reduction)


def _ladder_misfit(options: dict, hidden: int) -> str | None:
    width = ladder_width(hidden, options["reduction"])
    if width % options["attention_heads"] == 0:
        return None
    return (
        f"side width {width} (hidden {hidden} / reduction {options['reduction']}) is not divisible by "
        f"attention_heads {options['attention_heads']}"
    )


CNN_POOL = Option(
    str,
    "none",
    "The convolutions' input channels: none = every layer is a channel; lp = a learned "
    "scalar mix of the layers (1 channel); mean = the layer mean (1 channel).",
    choices=("none", "lp", "mean"),
)
CNN_ADAPTER_WIDTH = Option(
    int,
    0,
    "0 = no adapter; A > 0 = a shared AdapterPooler GELU(W x + b) maps the hidden "
    "axis to A first (after the pooling), so the convolutions run over A positions.",
    minimum=0,
)

register(
    HeadType(
        "cnn",
        "Gen-1's 1xN CNN: a convolution along the hidden axis with the layers as channels ('same' padding), "
        "ReLU, flattened, then a linear layer.",
        {
            "kernel": Option(int, 3, "Kernel size N of the 1xN convolution.", minimum=1, searchable=True),
            "channels": Option(int, 16, "Output channels (filters) of the convolution.", minimum=1, searchable=True),
            "dilation": Option(int, 1, "Dilation of the convolution ('same' padding keeps the width).", minimum=1),
            "pool": CNN_POOL,
            "adapter_width": CNN_ADAPTER_WIDTH,
            "dropout": Option(float, 0.1, "Dropout before the output layer.", minimum=0, maximum=1, searchable=True),
        },
        relative_cost=4.0,  # 0.068 vs 0.019 ms per row and epoch
    )
)
register(
    HeadType(
        "xception",
        "Gen-1's abbreviated Xception along the hidden axis (layers as channels): two strided convolutions, a "
        "separable-convolution block with a residual branch, global average pooling, then a linear layer.",
        {
            "cls_residual": Option(bool, False, "Concatenate the last layer's state before the output layer."),
            "pool": CNN_POOL,
            "adapter_width": CNN_ADAPTER_WIDTH,
            "dropout": DROPOUT,
        },
        relative_cost=130.0,  # 2.4 vs 0.019 ms per row and epoch
        misfit=_xception_misfit,
    )
)
register(
    HeadType(
        "cnn2d",
        "The original's 2-D CNN over each example's tokens x hidden image of every layer (tasks with "
        "token_features): the layers as channels, an optional shared adapter on the hidden axis first, two "
        "KxK convolutions with ReLU, a max over the real tokens and the width, then a linear layer.",
        {
            "kernel": Option(int, 3, "Kernel size K of the KxK convolutions.", minimum=1, searchable=True),
            "channels": Option(int, 16, "Filters of each convolution.", minimum=1, searchable=True),
            "adapter_width": Option(
                int,
                64,
                "0 = the raw hidden axis; A > 0 = a shared AdapterPooler GELU(W x + b) maps it to A first "
                "(the original's square adapter output; cheaper convolutions).",
                minimum=0,
            ),
            "dropout": Option(float, 0.1, "Dropout before the output layer.", minimum=0, maximum=1, searchable=True),
        },
        token_level=True,
        relative_cost=50.0,  # 11.3 vs 0.22 ms per row and step (64 tokens, MiniLM shapes, 1 thread, shared CPU)
    )
)
register(
    HeadType(
        "ladder",
        "Ladder side network (Ladder Side-Tuning): every chosen layer's token states projected to a "
        "side width hidden/reduction and merged into a side stream through learned gates, with side "
        "transformer blocks (self-attention over the real tokens, then a feed-forward) between the "
        "merges; pooled per example, or start/end logits per token for span tasks.",
        {
            "reduction": Option(
                int, 8, "Side width = hidden / reduction (MiniLM 384: 48).", minimum=1, maximum=64, searchable=True
            ),
            "blocks": Option(
                int,
                2,
                "Side transformer blocks, spread evenly over the ladders.",
                minimum=0,
                maximum=24,
                searchable=True,
            ),
            "top_layers": Option(
                int, 0, "Ladders from the top K layers only; 0 = every layer (embeddings included).", minimum=0
            ),
            "attention_heads": Option(
                int, 4, "Attention heads of each side block (must divide the side width).", minimum=1
            ),
            "pool": Option(
                str,
                "mean",
                "Per-example tasks: the side stream at the summary position ([CLS]), its masked mean over "
                "the real tokens, or attention with a learned query.",
                choices=("mean", "summary", "attention"),
            ),
            "dropout": Option(
                float,
                0.1,
                "Dropout in the side blocks and before the output layer.",
                minimum=0,
                maximum=1,
                searchable=True,
            ),
            "init": Option(
                str,
                "random",
                "The side network's start: random, or the encoder's own layers cut down to the side width "
                "(LST's structured pruning, by weight magnitude; BERT- and DistilBERT-style encoders).",
                choices=("random", "encoder"),
            ),
        },
        token_level=True,
        sequence=True,
        # per token as the request counts it: 3.6 ms per MRPC row (about 50 tokens) and epoch on one
        # core, against 0.07 ms per [CLS] row for adapter64 and about 2 ms for token-pool
        relative_cost=2.0,
        misfit=_ladder_misfit,
    )
)
