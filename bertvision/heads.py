"""The BERTVision head zoo. Every head takes hidden states X of shape (..., layers, hidden),
layer 0 being the embedding output, and returns (..., outputs): per example for [CLS]
features (batch, layers, hidden), or per token for span tasks (batch, tokens, layers, hidden)
with two outputs per token (start and end logits).

- ``ScalarMixHead`` (LP, learned pooling): gamma * sum_l softmax(w)_l X[l], then a linear head.
- ``LayerMeanHead`` (AP, average pooling): mean over layers, then a linear head.
- ``AdapterPoolerHead``: Z[l] = GELU(W X[l] + b) with W shared by all layers or one per layer,
  flattened over layers (optionally concatenated with the last layer's state), then a linear head.
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarMixHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, dropout: float = 0.0):
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


class LayerMeanHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(x.mean(dim=-2)))


class AdapterPoolerHead(nn.Module):
    def __init__(self, layers: int, hidden: int, outputs: int, width: int = 64, shared: bool = True,
                 skip: bool = False, dropout: float = 0.0):
        super().__init__()
        self.shared, self.skip = shared, skip
        if shared:
            self.adapter = nn.Linear(hidden, width)
        else:
            bound = hidden ** -0.5  # nn.Linear's default uniform init, per layer
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


class Standardized(nn.Module):
    """Standardize each (layer, dimension) of the input with fixed train-split statistics
    (buffers, not trained), then apply ``head``. Raw BERT states have a few outlier dimensions
    that otherwise dominate a linear head."""

    def __init__(self, head: nn.Module, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.head = head
        self.register_buffer("mean", mean)
        self.register_buffer("inv_std", 1.0 / std.clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head((x - self.mean) * self.inv_std)


HEADS: dict[str, type[nn.Module]] = {
    "lp": ScalarMixHead,
    "mean": LayerMeanHead,
    "adapter": AdapterPoolerHead,
}


def build_head(spec: dict, layers: int, hidden: int, outputs: int) -> nn.Module:
    """``spec``: {"type": one of HEADS, plus that class's keyword arguments}."""
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    try:
        cls = HEADS[spec["type"]]
    except KeyError:
        raise KeyError(f"unknown head type {spec['type']!r}; known: {', '.join(HEADS)}") from None
    return cls(layers, hidden, outputs, **kwargs)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
