"""How far the float16 rounding of the states can move an answer: the tolerance of the tests that
compare answers computed from differently batched encoder passes (the service against the
pipeline, a batch against its chunks, one request against many).

Each pass pads its batch to its own longest sequence, and the padded width changes the order in
which the CPU's kernels sum (the attention's sums run over the padded positions; on this
project's machine a padded width changes about one state in 30 by a float32 step, 2.4e-7 at
most, and the batch size alone changes none). The states are then rounded to float16, as
stored: an element rounds alike in every batching unless its float32 value lies within that
noise (``NOISE``, 16 times the largest seen) of a midpoint between two float16 values; then one
batching may round it up and another down, one float16 step apart (plus the noise itself, where
the step is smaller: states near zero). The embeddings' states (layer
0) are computed token by token and round alike. So an answer moves by at most the sum, over its
input elements at risk, of |d answer / d element| x that step (first order: the heads are smooth
at that scale). ``rounding_bound`` finds the elements at risk in one float32 pass and sums with
autograd; the tests allow that on top of their float32 tolerance, and a near tie (two labels,
two spans) may fall either way within it.

A bound over every element instead would be useless here: the tiny random BERT's [CLS] states
vary across texts by about one float16 step, which the heads' standardization scales up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

NOISE = 4e-6  # float32 states of one sequence in two batchings differ by less


def float32_states(encoder_dir: Path, tokens_file: Path, level: str):
    """Every row's states in one float32 pass of the encoder (before any float16 rounding):
    [CLS] (N, L, H) for level 'cls', the mean over real tokens (N, L, H) for 'mean'; every
    token's (N, T, L, H) and the mask (N, T) for 'tokens'."""
    from bertvision.data.tokenized import TokenizedSplit, collate
    from bertvision.models.encoder_io import SUMMARY_POSITION, load_encoder, pad_id

    tokens = TokenizedSplit.read(tokens_file)
    model = load_encoder(str(encoder_dir)).eval()
    batch = collate(tokens, np.arange(len(tokens)), pad_id(model))
    with torch.inference_mode():
        states = torch.stack(model(**batch, output_hidden_states=True).hidden_states, dim=2).numpy()
    if level == "cls":
        return (states[:, SUMMARY_POSITION],)
    mask = batch["attention_mask"].bool().numpy()
    if level == "mean":
        return ((states * mask[..., None, None]).sum(1) / mask.sum(1)[:, None, None],)
    return states * mask[..., None, None], mask


def apart_rounding_bound(
    head: torch.nn.Module, encoder_dir: Path, tokens_dir: Path, split: str, reads: str
) -> np.ndarray:
    """``rounding_bound`` for a pair encoded apart: each text's states (one float32 pass over the
    split's distinct texts) may round either way, and so may their ``pair_features``; the bound
    sums both (the first through the features' gradient)."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.features.encode import pair_features
    from bertvision.layout import split_file, texts_file

    (texts,) = float32_states(encoder_dir, texts_file(tokens_dir, split), reads)
    sides = TokenizedSplit.read(split_file(tokens_dir, split)).sides
    per_side = np.stack([texts[sides[:, 0]], texts[sides[:, 1]]], axis=1)  # (N, 2, L, H)

    def through_features(x):
        return head(pair_features(x[:, 0], x[:, 1]))

    rounded = torch.from_numpy(per_side.astype(np.float16).astype(np.float32))
    combined = pair_features(rounded[:, 0], rounded[:, 1]).numpy()
    exact = reads != "mean"
    return rounding_bound(through_features, per_side, exact_first_layer=exact) + rounding_bound(
        head, combined, exact_first_layer=False
    )


def rounding_bound(
    head: torch.nn.Module, x: np.ndarray, mask: np.ndarray | None = None, exact_first_layer: bool = True
) -> np.ndarray:
    """Per row (and token, for a span head, which scores each token on its own) and output: the
    sum over the row's elements at risk (float32 states ``x``; layers on dim -2) of
    |d output / d element| x the float16 step it may take. ``exact_first_layer``: the states of
    layer 0 are the same in any batching (true of a token's, not of a mean over tokens, whose
    sums run over each batch's padded width)."""
    x = np.asarray(x, dtype=np.float32)
    rounded = x.astype(np.float16)
    residual = x - rounded.astype(np.float32)
    up = np.nextafter(rounded, np.float16(np.inf)).astype(np.float32) - rounded.astype(np.float32)
    down = rounded.astype(np.float32) - np.nextafter(rounded, np.float16(-np.inf)).astype(np.float32)
    half = np.where(residual >= 0, up, down) / 2
    at_risk = np.abs(residual) >= half - NOISE
    if exact_first_layer:
        at_risk[..., 0, :] = False  # the embeddings' layer: token by token, the same in any batch
    if mask is not None:
        at_risk &= np.asarray(mask, dtype=bool)[..., None, None]
    step = np.maximum(up, down) + np.where(np.minimum(up, down) < NOISE, NOISE, 0)
    steps = torch.from_numpy(np.where(at_risk, step, 0).astype(np.float32))
    states = torch.from_numpy(rounded.astype(np.float32)).requires_grad_(True)
    with torch.enable_grad():
        out = head(states) if mask is None else head(states, torch.as_tensor(mask))
        bounds = []
        for k in range(out.shape[-1]):  # rows are independent: the gradient of the sum is each row's own
            (grad,) = torch.autograd.grad(out[..., k].sum(), states, retain_graph=True)
            bounds.append((grad.abs() * steps).flatten(start_dim=out.dim() - 1).sum(-1))
    return torch.stack(bounds, dim=-1).numpy()


def assert_close_within_rounding(got, want, bound, rtol: float, atol: float, what: str = "") -> None:
    """|got - want| <= bound + atol + rtol |want|, elementwise: the float32 tolerance and what
    float16 rounding can add."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    allowed = np.broadcast_to(bound, want.shape) + atol + rtol * np.abs(want)
    over = np.abs(got - want) > allowed
    assert not over.any(), (
        f"{what}: {int(over.sum())} of {over.size} differ by more than float16 rounding allows; first at "
        f"{np.argwhere(over)[0].tolist()}: {got[over][0]} vs {want[over][0]} (allowed {allowed[over][0]:.3g})"
    )


def near_best_spans(windows, context: str, max_answer_length: int, margin: float) -> set[str]:
    """The texts of every valid span of a question (over its windows: (start logits, end logits,
    offsets)) scoring within ``margin`` of its best one: the answers a near tie may give."""
    scored = []
    for start, end, offsets in windows:
        inside = offsets[:, 0] >= 0
        s = np.where(inside, start, -np.inf)
        e = np.where(inside, end, -np.inf)
        length = np.arange(len(e))[None, :] - np.arange(len(s))[:, None] + 1
        scores = np.where((length >= 1) & (length <= max_answer_length), s[:, None] + e[None, :], -np.inf)
        for i, j in zip(*np.nonzero(np.isfinite(scores))):
            scored.append((float(scores[i, j]), context[offsets[i, 0] : offsets[j, 1]]))
    if not scored:
        return {""}
    best = max(score for score, _ in scored)
    return {text for score, text in scored if score >= best - margin}


def span_tolerances(
    head: torch.nn.Module,
    encoder_dir: Path,
    tokens_file: Path,
    contexts: list[str],
    max_answer_length: int,
    atol: float,
) -> list[tuple[float, set[str]]]:
    """Per question of a span task's tokenized split (``contexts`` in row order): how far its
    score_diff may move (the best span's two logits and the null score's two, each by its
    token's bound, plus ``atol``) and the best spans a near tie within that may give."""
    from bertvision.data.tokenized import TokenizedSplit

    windows = TokenizedSplit.read(tokens_file)
    x, mask = float32_states(encoder_dir, tokens_file, "tokens")
    bound = rounding_bound(head, x) * mask[..., None]  # (windows, tokens, 2); a span head reads no mask
    with torch.no_grad():
        logits = head(torch.from_numpy(x.astype(np.float16).astype(np.float32))).numpy()
    out = []
    for q, context in enumerate(contexts):
        mine = [(w, int(windows.lengths[w])) for w in np.flatnonzero(windows.idx == q)]
        moves = max(bound[w, :n, 0].max() for w, n in mine) + max(bound[w, :n, 1].max() for w, n in mine)
        tolerance = 2 * float(moves) + atol
        spans = [(logits[w, :n, 0], logits[w, :n, 1], windows.offsets[w]) for w, n in mine]
        out.append((tolerance, near_best_spans(spans, context, max_answer_length, tolerance)))
    return out
