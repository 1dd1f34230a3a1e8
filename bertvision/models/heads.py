"""The BERTVision head zoo (``nn.Module``s only; their options and defaults are registered in
``bertvision.registry.heads``). Every head takes hidden states X of shape (..., layers, hidden),
layer 0 being the embedding output, and returns (..., outputs): per example for [CLS]
features (batch, layers, hidden), or per token for span tasks (batch, tokens, layers, hidden)
with two outputs per token (start and end logits).

- ``ScalarMixHead`` (LP, learned pooling): gamma * sum_l softmax(w)_l X[l], then a linear head.
- ``LayerMeanHead`` (AP, average pooling): mean over layers, then a linear head.
- ``AdapterPoolerHead``: Z[l] = GELU(W X[l] + b) with W shared by all layers or one per layer,
  flattened over layers (optionally concatenated with the last layer's state), then a linear head.
- ``CosineHead`` (pairs encoded apart): the cosine of the two texts' layer-mixed states, then a
  linear head.
- ``TokenPoolHead`` (token level, per example): every real token of the example,
  X (batch, tokens, layers, hidden) with a padding mask (batch, tokens); a learned scalar mix
  over layers per token, then masked pooling over the real tokens that does not depend on
  positions (attention pooling with a learned query, and/or the masked mean), then a linear
  head. Unlike the original's AP_GLUE (position-specific weights over the flattened, padded
  sequence), padding never changes the output and the size does not grow with the length.

Gen-1's convolutional heads (the 1xN CNN and the abbreviated Xception) are in
``bertvision.models.cnn_heads``.
"""

from __future__ import annotations

import torch
from torch import nn

from bertvision.models import cnn_heads, ladder  # noqa: F401  (their @builds classes, for build_head)
from bertvision.registry.heads import HEAD_CLASSES, builds, constructor_options, get_head_type, shape_problem
from bertvision.registry.states import PAIR_PARTS


@builds("lp")
class ScalarMixHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, *, dropout: float):
        super().__init__()
        self.layer_logits = nn.Parameter(torch.zeros(layers))
        self.gamma = nn.Parameter(torch.ones(()))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, outputs)

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_logits, dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.gamma * torch.einsum("l,...lh->...h", self.layer_weights(), x)
        return self.classifier(self.dropout(mixed))


@builds("mean")
class LayerMeanHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, *, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(x.mean(dim=-2)))


@builds("adapter")
class AdapterPoolerHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, *, width: int, shared: bool, skip: bool, dropout: float):
        super().__init__()
        self.shared, self.skip = shared, skip
        if shared:
            self.adapter = nn.Linear(hidden, width)
        else:
            bound = hidden**-0.5  # nn.Linear's default uniform init, per layer
            self.weight = nn.Parameter(torch.empty(layers, hidden, width).uniform_(-bound, bound))
            self.bias = nn.Parameter(torch.empty(layers, width).uniform_(-bound, bound))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(layers * width + (hidden if skip else 0), outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared:
            z = self.adapter(x)
        else:
            z = torch.einsum("...lh,lha->...la", x, self.weight) + self.bias
        features = nn.functional.gelu(z).flatten(-2)
        if self.skip:
            features = torch.cat([features, x[..., -1, :]], dim=-1)
        return self.classifier(self.dropout(features))


@builds("cosine")
class CosineHead(nn.Module):
    """A pair encoded apart (features ``registry.states.PAIR_PARTS``: u, v, |u-v|, u*v per layer): one
    learned layer mix applied to each side's states, the cosine of the two mixes, then a linear
    layer on it (for a similarity regression, a scale and an offset). The cosine of two pooled
    embeddings is what a bi-encoder was trained to score."""

    # u and v standardized alike (``standardized``): a similarity does not change when its two
    # texts swap places, nor its correction, which reads only the parts that do not either
    sides_alike = True

    def __init__(self, layers: int, hidden: int, outputs: int, *, residual: int, dropout: float):
        super().__init__()
        self.side = hidden // len(PAIR_PARTS)
        # Starts nearly at the last layer, the embedding a bi-encoder is trained to give (weight
        # 0.96 with 7 layers): the even mix over every layer is a worse start than no training.
        self.layer_logits = nn.Parameter(torch.zeros(layers).index_fill_(0, torch.tensor([layers - 1]), 5.0))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(1, outputs)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)
        # the correction reads the symmetric parts, |u-v| and u*v
        self.correction = AdapterPoolerHead(layers, hidden - 2 * self.side, outputs, width=residual, shared=True,
                                            skip=False, dropout=dropout) if residual else None  # fmt: skip
        if self.correction is not None:
            nn.init.zeros_(self.correction.classifier.weight)
            nn.init.zeros_(self.correction.classifier.bias)

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_logits, dim=0)

    def cosine(self, x: torch.Tensor) -> torch.Tensor:
        mixed = torch.einsum("l,...lh->...h", self.layer_weights(), x[..., : 2 * self.side])
        u, v = mixed[..., : self.side], mixed[..., self.side :]
        return nn.functional.cosine_similarity(u, v, dim=-1)[..., None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.classifier(self.dropout(self.cosine(x)))
        return out if self.correction is None else out + self.correction(x[..., 2 * self.side :])

    @torch.no_grad()
    def fit_output(self, x: torch.Tensor, targets: torch.Tensor) -> None:
        """Start the scale and offset at the least-squares fit of ``targets`` (B, outputs) on the
        cosine of the first training batch ``x``. A cosine spreads over a few tenths, a target
        over units: from any fixed start, a head's learning rate (1e-3 a step) takes thousands of
        steps to reach the scale, and a random start of the wrong sign hundreds to undo."""
        cosine = self.cosine(x)
        centred = cosine - cosine.mean(0)
        slope = (centred * (targets - targets.mean(0))).mean(0) / centred.pow(2).mean().clamp_min(1e-12)
        self.classifier.weight.copy_(slope[:, None])
        self.classifier.bias.copy_(targets.mean(0) - slope * cosine.mean())


@builds("token-pool")
class TokenPoolHead(nn.Module):
    """Per-example outputs from every real token: ``forward(x, mask)`` with x (B, T, L, H) and
    mask (B, T) True on real tokens (None = all real). ``pool``: 'attention-mean' (both,
    concatenated), 'attention' or 'mean'. Parameters: L + 1 (mix) + H (query, if attention)
    + (H or 2H) * outputs + outputs."""

    def __init__(self, layers: int, hidden: int, outputs: int, *, pool: str, dropout: float):
        super().__init__()
        pools = get_head_type("token-pool").options["pool"].choices
        if pool not in pools:
            raise ValueError(f"token-pool head: pool {pool!r} not in {pools}")
        self.pool = pool
        self.layer_logits = nn.Parameter(torch.zeros(layers))
        self.gamma = nn.Parameter(torch.ones(()))
        if pool != "mean":
            self.query = nn.Parameter(torch.zeros(hidden))  # zero: attention starts as the mean
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden * (2 if pool == "attention-mean" else 1), outputs)

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_logits, dim=0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(
                f"token-pool head: expected (batch, tokens, layers, hidden), got {tuple(x.shape)} "
                "([CLS] features? the task needs token_features)"
            )
        if mask is None:
            mask = torch.ones(x.shape[:-2], dtype=torch.bool, device=x.device)
        # Padding positions are zeroed first, so whatever they hold (even inf/nan) cannot leak.
        x = x.masked_fill(~mask[..., None, None], 0.0)
        tokens = self.gamma * torch.einsum("l,...tlh->...th", self.layer_weights(), x)  # (B, T, H)
        pooled = []
        if self.pool != "mean":
            scores = (tokens @ self.query) * tokens.shape[-1] ** -0.5
            attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            pooled.append(torch.einsum("...t,...th->...h", attn, tokens))
        if self.pool != "attention":
            count = mask.sum(dim=-1, keepdim=True).clamp_min(1).to(tokens.dtype)
            pooled.append(tokens.sum(dim=-2) / count)
        return self.classifier(self.dropout(torch.cat(pooled, dim=-1)))


class Standardized(nn.Module):
    """``head`` between fixed train-split statistics (buffers, not trained): its input
    standardized per (layer, dimension) when ``mean`` and ``std`` are given (raw BERT states have
    a few outlier dimensions that otherwise dominate a linear head), and, for a regression, its
    output read in standard units of the training labels (``label_mean``, ``label_std``): a head
    that outputs 0 predicts the training mean, and a scale far from 1 (STS-B's 0-5) needs no
    learning; the cosine head, which starts at 0, stayed near its start without it."""

    def __init__(self, head: nn.Module, mean=None, std=None, label_mean=None, label_std=None):
        super().__init__()
        self.head = head
        self.standardizes_input = mean is not None
        self.scales_output = label_mean is not None
        if self.standardizes_input:
            self.register_buffer("mean", mean)
            self.register_buffer("inv_std", 1.0 / std.clamp_min(1e-6))
        if self.scales_output:
            self.register_buffer("label_mean", torch.as_tensor(label_mean, dtype=torch.float32))
            self.register_buffer("label_std", torch.as_tensor(label_std, dtype=torch.float32).clamp_min(1e-6))

    @property
    def reads_sequence(self) -> bool:
        return getattr(self.head, "reads_sequence", False)

    @property
    def label_moments(self) -> tuple | None:
        return (self.label_mean, self.label_std) if self.scales_output else None

    def standardize_input(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.inv_std if self.standardizes_input else x

    def standard_labels(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.label_mean) / self.label_std

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        """``args`` (e.g. a token head's padding mask) pass through to the head."""
        out = self.head(self.standardize_input(x), *args)
        return out * self.label_std + self.label_mean if self.scales_output else out


def fit_output(head: nn.Module, x: torch.Tensor, y: torch.Tensor, outputs: int) -> None:
    """Let a head that starts its output from the data (``fit_output``, the cosine head's) fit it to
    the batch ``x``, ``y`` as it will see them: the input standardized, the labels in standard units
    (a regression) or one-hot (a classification)."""
    core = core_head(head)
    if not hasattr(core, "fit_output"):
        return
    if isinstance(head, Standardized):
        x = head.standardize_input(x)
    y = head.standard_labels(y) if isinstance(head, Standardized) and head.scales_output else y
    targets = y.float()[:, None] if outputs == 1 else nn.functional.one_hot(y.long(), outputs).float()
    core.fit_output(x.float(), targets)


def standardized(head: nn.Module, moments=None, label_moments=None) -> nn.Module:
    """``head`` wrapped in ``Standardized`` when there is anything to standardize, else itself. A
    head that reads a pair's two texts as one (``sides_alike``) has u and v standardized alike."""
    if moments is None and label_moments is None:
        return head
    if moments is not None and getattr(head, "sides_alike", False):
        moments = sides_alike(*moments)
    return Standardized(head, *(moments or (None, None)), *(label_moments or (None, None)))


def sides_alike(mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Moments of a pair's apart states (``PAIR_PARTS`` along the last axis) with u's and v's each
    replaced by the two sides' pooled moments (equal counts: the mean of the means; the mean of
    the variances plus the means' spread about it); |u-v| and u*v keep their own."""
    side = mean.shape[-1] // len(PAIR_PARTS)
    mean_u, mean_v = mean[..., :side], mean[..., side : 2 * side]
    var = (std[..., :side] ** 2 + std[..., side : 2 * side] ** 2) / 2 + ((mean_u - mean_v) / 2) ** 2
    pooled_mean, pooled_std = (mean_u + mean_v) / 2, var.sqrt()
    return (
        torch.cat([pooled_mean, pooled_mean, mean[..., 2 * side :]], dim=-1),
        torch.cat([pooled_std, pooled_std, std[..., 2 * side :]], dim=-1),
    )


def core_head(head: nn.Module) -> nn.Module:
    """The trained head inside its standardization, if any."""
    return head.head if isinstance(head, Standardized) else head


def span_logits(head: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, outputs) per-token outputs of a span head over padded windows x (B, T, L, H):
    a sequence head (``reads_sequence``, e.g. ladder) reads each window whole under its mask;
    the others score the real tokens one by one (padding never enters a BatchNorm's batch
    statistics). Padding positions get -1e4."""
    if getattr(head, "reads_sequence", False):
        return head(x, mask, True).masked_fill(~mask[..., None], -1e4)
    real = head(x[mask])
    logits = torch.full((*mask.shape, real.shape[-1]), -1e4, device=x.device, dtype=real.dtype)
    logits[mask] = real
    return logits


def build_head(spec: dict, layers: int, hidden: int, outputs: int) -> nn.Module:
    """``spec``: {"type": a registered head type, plus any of its options (the others take their
    registered defaults)}."""
    head_class = HEAD_CLASSES[get_head_type(spec["type"]).name]  # an unknown type: one line naming the known
    problem = shape_problem(spec, hidden)
    if problem:
        raise ValueError(f"{spec['type']} head: {problem}")
    return head_class(layers, hidden, outputs, **constructor_options(spec))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
