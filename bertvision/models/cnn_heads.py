"""Gen-1's convolutional heads (``nn.Module``s only; options and defaults in
``bertvision.registry.heads``). Each example's (layers, hidden) states are a 1 x hidden "image"
whose channels are the layers, and the convolutions run along the hidden axis. They take X of
shape (..., layers, hidden) like every head (per example, or per token for span tasks) and
return (..., outputs); the leading dimensions are flattened into one batch for the convolutions.

- ``ConvFront``: what the convolutions see, (N, channels, width): every layer as a channel, or one
  channel from a learned scalar mix (LP) or the layer mean, optionally through a shared
  AdapterPooler GELU(W x + b) that maps the hidden axis to the adapter's width.
- ``ConvHead`` (``cnn``): the 1xN CNN of the original's SQuAD grid.
- ``XceptionHead`` (``xception``): the abbreviated Xception of the original's answerable
  classifier (original-system.md §2.7).
"""

from __future__ import annotations

import torch
from torch import nn

from bertvision.registry.heads import builds, get_head_type


class ConvFront(nn.Module):
    """(N, layers, hidden) -> (N, channels, width). ``pool``: 'none' (channels = layers), 'lp'
    or 'mean' (1 channel); ``adapter_width`` A > 0: width = A (a shared Linear(hidden, A) + GELU
    after the pooling), else width = hidden. Parameters: L + 1 (lp) + H·A + A (adapter)."""

    def __init__(self, head: str, layers: int, hidden: int, *, pool: str, adapter_width: int):
        super().__init__()
        pools = get_head_type(head).options["pool"].choices
        if pool not in pools:
            raise ValueError(f"{head} head: pool {pool!r} not in {pools}")
        self.pool = pool
        if pool == "lp":
            self.layer_logits = nn.Parameter(torch.zeros(layers))
            self.gamma = nn.Parameter(torch.ones(()))
        self.adapter = nn.Linear(hidden, adapter_width) if adapter_width > 0 else None
        self.channels = layers if pool == "none" else 1
        self.width = adapter_width if adapter_width > 0 else hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool == "lp":
            x = self.gamma * torch.einsum("l,nlh->nh", torch.softmax(self.layer_logits, dim=0), x)[:, None]
        elif self.pool == "mean":
            x = x.mean(dim=1, keepdim=True)
        if self.adapter is not None:
            x = nn.functional.gelu(self.adapter(x))
        return x


def _images(x: torch.Tensor) -> torch.Tensor:
    """(..., layers, hidden) -> (N, layers, hidden), N the product of the leading dimensions."""
    return x.reshape(-1, *x.shape[-2:])


@builds("cnn")
class ConvHead(nn.Module):
    """1xN CNN: ``ConvFront``, then Conv1d(channels_in -> F, kernel K, dilation D, 'same' padding)
    along the width W, ReLU, flattened (F·W), dropout, Linear(F·W -> C).

    Parameters: front + C_in·K·F + F + F·W·C + C, with C_in = L (pool none) or 1, W = H or A,
    front = L + 1 (lp) + H·A + A (adapter). MiniLM (L 7, H 384), C 2, defaults (K 3, F 16):
    336 + 16 + 12,288 + 2 = 12,642."""

    def __init__(
        self,
        layers: int,
        hidden: int,
        outputs: int,
        *,
        kernel: int,
        channels: int,
        dilation: int,
        pool: str,
        adapter_width: int,
        dropout: float,
    ):
        super().__init__()
        self.front = ConvFront("cnn", layers, hidden, pool=pool, adapter_width=adapter_width)
        self.conv = nn.Conv1d(self.front.channels, channels, kernel, dilation=dilation, padding="same")
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(channels * self.front.width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.relu(self.conv(self.front(_images(x)))).flatten(1)
        return self.classifier(self.dropout(z)).reshape(*x.shape[:-2], -1)


class SeparableConv1d(nn.Sequential):
    """Keras' SeparableConv (use_bias=False): a depthwise convolution ('same' padding), then a
    pointwise one. Parameters: in·K + in·out."""

    def __init__(self, inputs: int, outputs: int, kernel: int):
        super().__init__(
            nn.Conv1d(inputs, inputs, kernel, padding="same", groups=inputs, bias=False),
            nn.Conv1d(inputs, outputs, 1, bias=False),
        )


def _bn_relu(channels: int) -> list[nn.Module]:
    return [nn.BatchNorm1d(channels), nn.ReLU()]


@builds("xception")
class XceptionHead(nn.Module):
    """The abbreviated Xception along the width W (hidden, or the adapter's width), no conv biases:

        entry:    Conv(64, k3, stride 3, valid) BN ReLU  Conv(128, k3, valid) BN ReLU   W -> W1 -> W2
        residual: Conv(512, k1, stride 2) BN                                            W2 -> ceil(W2/2)
        main:     SepConv(256, k3) BN ReLU  SepConv(512, k3) BN  AvgPool(3, stride 2, 'same',
                  padding not averaged)                                                 W2 -> ceil(W2/2)
        residual + main, global average pooling (512) [+ the last layer's state (H) with
        cls_residual], dropout, Linear(-> C)

    with W1 = floor((W - 3) / 3) + 1, W2 = W1 - 2 (1024 -> 341 -> 339 -> 170). Trainable
    parameters, C_in = L (pool none) or 1: front + 192·C_in + 24,576 + 65,536 + 33,152 + 131,840
    (convolutions) + 2·(64 + 128 + 512 + 256 + 512) (BN) + (512 [+ H])·C + C; BN adds
    2·(64 + 128 + 512 + 256 + 512) running statistics. Original (L 26, H 1024, C 2): 264,066
    trainable, 267,010 with the running statistics (Keras' count), 266,114 trainable with cls_residual.
    W must be at least ``registry.heads.XCEPTION_MIN_WIDTH`` (``build_head`` checks it)."""

    def __init__(
        self,
        layers: int,
        hidden: int,
        outputs: int,
        *,
        cls_residual: bool,
        pool: str,
        adapter_width: int,
        dropout: float,
    ):
        super().__init__()
        self.front = ConvFront("xception", layers, hidden, pool=pool, adapter_width=adapter_width)
        self.cls_residual = cls_residual
        self.entry = nn.Sequential(
            nn.Conv1d(self.front.channels, 64, 3, stride=3, bias=False),
            *_bn_relu(64),
            nn.Conv1d(64, 128, 3, bias=False),
            *_bn_relu(128),
        )
        self.residual = nn.Sequential(nn.Conv1d(128, 512, 1, stride=2, bias=False), nn.BatchNorm1d(512))
        self.main = nn.Sequential(
            SeparableConv1d(128, 256, 3),
            *_bn_relu(256),
            SeparableConv1d(256, 512, 3),
            nn.BatchNorm1d(512),
            nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False),
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(512 + (hidden if cls_residual else 0), outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = _images(x)
        z = self.entry(self.front(images))
        features = (self.residual(z) + self.main(z)).mean(dim=-1)
        if self.cls_residual:
            features = torch.cat([features, images[:, -1]], dim=-1)
        return self.classifier(self.dropout(features)).reshape(*x.shape[:-2], -1)


@builds("cnn2d")
class TokenImageHead(nn.Module):
    """The original's 2-D CNN (``cnn2d``): each example's tokens x hidden "image" with the layers as
    channels, the hidden axis optionally mapped to A by a shared AdapterPooler GELU(W x + b)
    first (the original's square adapter output), then Conv2d(L -> F, K x K, 'same'), ReLU,
    Conv2d(F -> F, K x K, 'same'), ReLU, a max over the real tokens and the width, dropout and
    Linear(F -> C). ``forward(x, mask)``: x (B, T, L, H), mask (B, T) True on real tokens.
    Padding is zeroed before the convolutions and left out of the max, so no padded position
    changes the output. Parameters: H·A + A (adapter) + L·K²·F + F + F·K²·F + F + F·C + C."""

    def __init__(self, layers: int, hidden: int, outputs: int, *, kernel: int, channels: int, adapter_width: int,
                 dropout: float):  # fmt: skip
        super().__init__()
        self.adapter = nn.Linear(hidden, adapter_width) if adapter_width > 0 else None
        self.convs = nn.ModuleList(
            [nn.Conv2d(layers, channels, kernel, padding="same"), nn.Conv2d(channels, channels, kernel, padding="same")]
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(channels, outputs)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(
                f"cnn2d head: expected (batch, tokens, layers, hidden), got {tuple(x.shape)} "
                "([CLS] features? the task needs token_features)"
            )
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if self.adapter is not None:
            x = nn.functional.gelu(self.adapter(x.masked_fill(~mask[..., None, None], 0.0)))
        image = x.permute(0, 2, 1, 3)  # (B, L, T, W): the layers are the channels
        padding = ~mask[:, None, :, None]
        image = image.masked_fill(padding, 0.0)  # after the adapter too: GELU(b) is not 0
        for conv in self.convs:
            image = torch.relu(conv(image)).masked_fill(padding, 0.0)  # zero again: 'same' padding spreads
        pooled = image.masked_fill(padding, float("-inf")).amax(dim=(2, 3))
        return self.classifier(self.dropout(pooled))
