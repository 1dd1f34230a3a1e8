"""The ladder side network (after Ladder Side-Tuning, Sung, Cho and Bansal, NeurIPS 2022), over
the stored or streamed hidden states of a frozen encoder.

Every chosen encoder layer l sends its token states down a "ladder": a linear projection from
the encoder's width H to the side width d = H / reduction. The side stream starts from the
lowest chosen layer's ladder and takes in each higher one through a learned gate,
h = mu_l * down_l(X[l]) + (1 - mu_l) * h with mu_l = sigmoid(alpha_l) (alpha_l = 0: an even
mix at the start). After every group of ladders, a side transformer block (pre-norm
self-attention over the example's real tokens under the padding mask, then a feed-forward of
width 2d) lets the tokens interact after the encoder, which no pooling head does. The encoder
is never back-propagated through: its states are inputs.

``init: encoder`` starts the side network as the encoder cut down to width d instead of at
random (``init_from_encoder``: the job that trains the head reads the checkpoint's weights).

Outputs: per example, from the side stream pooled over the real tokens (the summary position,
the masked mean, or attention with a learned query); or per token (``per_token=True``: span
start/end logits). Padding positions are zeroed on entry and masked as attention keys and in
the pooling, so padding never changes an example's output.

Parameters (MiniLM: L 7, H 384, d 48, 2 blocks, 2 outputs): ladders L(Hd + d) = 129,360,
gates L = 7, blocks 2(8d^2 + 11d) = 37,920, final norm 2d = 96, output dC + C = 98 (pool
attention: + d): 167,481, 0.74% of the encoder.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bertvision.registry.heads import builds, get_head_type, ladder_width


@builds("ladder")
class LadderHead(nn.Module):
    """``forward(x, mask=None, per_token=False)``: x (B, T, L, H), mask (B, T) True on real
    tokens (None = all real); returns (B, outputs), or (B, T, outputs) with ``per_token``."""

    reads_sequence = True

    def __init__(
        self,
        layers: int,
        hidden: int,
        outputs: int,
        *,
        reduction: int,
        blocks: int,
        top_layers: int,
        attention_heads: int,
        pool: str,
        dropout: float,
        init: str,
    ):
        super().__init__()
        options = get_head_type("ladder").options
        if pool not in options["pool"].choices:
            raise ValueError(f"ladder head: pool {pool!r} not in {options['pool'].choices}")
        width = ladder_width(hidden, reduction)  # divisible by attention_heads (build_head checks it)
        used = layers if top_layers == 0 else min(top_layers, layers)
        self.first_layer, self.width, self.pool, self.init = layers - used, width, pool, init
        bound = hidden**-0.5  # nn.Linear's default uniform init, one projection per layer
        self.down_weight = nn.Parameter(torch.empty(used, hidden, width).uniform_(-bound, bound))
        self.down_bias = nn.Parameter(torch.empty(used, width).uniform_(-bound, bound))
        self.gate_logits = nn.Parameter(torch.zeros(used))
        # Block b runs after the ladders of group b: the used layers cut into `blocks` groups,
        # as even as they go (the last block sees the top layer).
        self.merge_before = [math.ceil((b + 1) * used / blocks) for b in range(blocks)] if blocks else []
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                attention_heads,
                dim_feedforward=2 * width,
                dropout=dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(blocks)
        )
        self.norm = nn.LayerNorm(width)
        if pool == "attention":
            self.query = nn.Parameter(torch.zeros(width))  # zero: attention starts as the mean
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(width, outputs)

    def source_layers(self, encoder_layers: int) -> list[int]:
        """The encoder layer each side block is pruned from (``init: encoder``): the one that
        reads the hidden state of the block's last ladder (hidden state i is layer i's input;
        the top state, which no layer reads, takes the top layer)."""
        return [min(self.first_layer + m - 1, encoder_layers - 1) for m in self.merge_before]

    @torch.no_grad()
    def init_from_encoder(self, layers: list[dict]) -> None:
        """Initialise the side network from the encoder's own layers cut down to the side width
        (LST's structured pruning, with weight magnitude as the importance: data-free, where
        LST uses Fisher information). One set of d residual dimensions, those with the largest
        summed weight magnitude over the source layers, is kept everywhere: each ladder starts
        as the selection of those dimensions, so the side stream starts as the encoder's own
        states there. Each block takes its source layer's attention (the ``attention_heads``
        heads of largest magnitude, in each the d / heads dimensions of largest magnitude, the
        query rescaled for the narrower heads), its feed-forward (the 2d neurons of largest
        magnitude) and its norms (BERT's post-norms moved before the sublayers they feed).
        ``layers``: ``encoder_io.encoder_layers``."""
        sources = [layers[i] for i in self.source_layers(len(layers))] or layers[-1:]
        importance = sum(residual_importance(layer) for layer in sources)
        keep = torch.topk(importance, self.width).indices.sort().values
        self.down_weight.zero_()
        self.down_weight[:, keep, torch.arange(self.width)] = 1.0
        self.down_bias.zero_()
        for block, layer in zip(self.blocks, sources):
            _prune_block(block, layer, keep)
        _copy_norm(self.norm, sources[-1]["norm_out"], keep)

    def gates(self) -> torch.Tensor:
        return torch.sigmoid(self.gate_logits)

    def side_stream(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, d): the side network's states of every token."""
        x = x[..., self.first_layer :, :].masked_fill(~mask[..., None, None], 0.0)
        ladders = torch.einsum("btlh,lhd->btld", x, self.down_weight) + self.down_bias
        gates = self.gates()
        padding = ~mask
        h = ladders[:, :, 0]
        merged = 1
        for b, block in enumerate(self.blocks):
            for layer in range(merged, self.merge_before[b]):
                h = gates[layer] * ladders[:, :, layer] + (1 - gates[layer]) * h
            merged = self.merge_before[b]
            h = block(h, src_key_padding_mask=padding)
        for layer in range(merged, ladders.shape[2]):
            h = gates[layer] * ladders[:, :, layer] + (1 - gates[layer]) * h
        return self.norm(h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, per_token: bool = False) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(
                f"ladder head: expected (batch, tokens, layers, hidden), got {tuple(x.shape)} "
                "([CLS] features? the task needs token_features)"
            )
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        h = self.side_stream(x, mask)
        if per_token:
            return self.classifier(self.dropout(h))
        if self.pool == "summary":
            pooled = h[:, 0]
        elif self.pool == "mean":
            count = mask.sum(dim=1, keepdim=True).clamp_min(1).to(h.dtype)
            pooled = h.masked_fill(~mask[..., None], 0.0).sum(dim=1) / count
        else:
            scores = (h @ self.query) * self.width**-0.5
            attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            pooled = torch.einsum("bt,btd->bd", attn, h)
        return self.classifier(self.dropout(pooled))


def residual_importance(layer: dict) -> torch.Tensor:
    """(H,) summed weight magnitude of each residual dimension in a layer: the columns that read
    it (query, key, value, feed-forward in) and the rows that write it (attention out,
    feed-forward out)."""
    reads = sum(layer[name][0].abs().sum(dim=0) for name in ("q", "k", "v", "ff_in"))
    writes = sum(layer[name][0].abs().sum(dim=1) for name in ("out", "ff_out"))
    return reads + writes


def _copy_norm(norm: nn.LayerNorm, source: tuple, keep: torch.Tensor) -> None:
    norm.weight.copy_(source[0][keep])
    norm.bias.copy_(source[1][keep])


def _prune_block(block: nn.TransformerEncoderLayer, layer: dict, keep: torch.Tensor) -> None:
    """``block`` (width d, a heads, feed-forward 2d) <- ``layer`` (width H, A heads, feed-forward
    F) restricted to the residual dimensions ``keep``."""
    attention = block.self_attn
    side_heads, width = attention.num_heads, attention.embed_dim
    side_dim = width // side_heads
    heads = layer["heads"]
    head_dim = layer["q"][0].shape[0] // heads
    if side_heads > heads or side_dim > head_dim:
        raise ValueError(
            f"ladder head: init encoder needs at most {heads} attention_heads of at most {head_dim} "
            f"dimensions (the encoder's), got {side_heads} of {side_dim}"
        )
    # magnitude of each inner attention dimension: its query/key/value rows and output column
    inner = sum(layer[name][0][:, keep].abs().sum(dim=1) for name in ("q", "k", "v"))
    inner = (inner + layer["out"][0][keep].abs().sum(dim=0)).view(heads, head_dim)
    chosen_heads = torch.topk(inner.sum(dim=1), side_heads).indices.sort().values
    dims = torch.cat(
        [h * head_dim + torch.topk(inner[h], side_dim).indices.sort().values for h in chosen_heads.tolist()]
    )
    scale = (side_dim / head_dim) ** 0.5  # q.k over fewer dims, scaled by 1/sqrt(side_dim)
    q, k, v = (layer[name] for name in ("q", "k", "v"))
    attention.in_proj_weight.copy_(torch.cat([q[0][dims][:, keep] * scale, k[0][dims][:, keep], v[0][dims][:, keep]]))
    attention.in_proj_bias.copy_(torch.cat([q[1][dims] * scale, k[1][dims], v[1][dims]]))
    attention.out_proj.weight.copy_(layer["out"][0][keep][:, dims])
    attention.out_proj.bias.copy_(layer["out"][1][keep])
    ff_in, ff_out = layer["ff_in"], layer["ff_out"]
    neurons = ff_in[0][:, keep].abs().sum(dim=1) + ff_out[0][keep].abs().sum(dim=0)
    chosen = torch.topk(neurons, block.linear1.out_features).indices.sort().values
    block.linear1.weight.copy_(ff_in[0][chosen][:, keep])
    block.linear1.bias.copy_(ff_in[1][chosen])
    block.linear2.weight.copy_(ff_out[0][keep][:, chosen])
    block.linear2.bias.copy_(ff_out[1][keep])
    _copy_norm(block.norm1, layer["norm_in"], keep)
    _copy_norm(block.norm2, layer["norm_mid"], keep)
