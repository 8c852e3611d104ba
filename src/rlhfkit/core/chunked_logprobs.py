"""Chosen-token log-probabilities (and entropy) straight from final hidden states, without full logits.

The straightforward path projects every hidden row to the vocabulary, z = (h W^T + b) / T, keeps the
(N, V) logits alive for backward, and only then reads one value per row. Here both passes walk (rows,
vocabulary) tiles of a few MiB: forward reduces each tile into running per-row sums (an online
log-sum-exp) and drops it, so memory holds (N,) outputs plus one tile instead of (N, V); backward rebuilds
each tile from the saved hidden states and weight (one extra matmul) rather than storing it, and writes
its own rows of dL/dW, so beside that gradient only one tile lives.

Maths, per row with p = softmax(z) and lse = logsumexp(z):
    logp_y = z_y - lse                          d logp_y / dz = onehot(y) - p
    H = lse - sum_j p_j z_j = -sum_j p_j log p_j  dH / dz_j     = -p_j (log p_j + H)
and z = (h W^T + b) / T, so with g = dL/dz (N, V):
    dL/dh = (g / T) W,   dL/dW = (g / T)^T h,   dL/db = sum_rows (g / T).
The per-row lse and entropy are saved from forward (2 N floats), so a backward tile needs only
p = exp(z - lse) of its own columns. An output nobody differentiates (a logged entropy) adds no backward
work. Values and gradients equal the straightforward computation up to float rounding; outputs are
float32 for float32 or half-precision inputs (float64 for float64 ones).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlhfkit.core.onednn_products import linear_forward

# Tiles of at most 4 MiB of float32 logits: a row group of up to ROW_GROUP rows times at least
# MIN_TILE_COLUMNS vocabulary entries (256 at a full row group). At a 152k vocabulary, for 1,048 and 4,120
# rows, backward tiles of 4, 8 and 16 MiB took the same time, about half that of the 32 MiB row chunks
# used before, which passed over all of dL/dW once per chunk (the figures behind the choice, forward and
# backward: `git show 39778f3:benchmarks/FINDINGS.md`).
TILE_ELEMENTS = 1 << 20
ROW_GROUP = 4096
MIN_TILE_COLUMNS = 256


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    """(n, H) rows -> (n, V) logits, at least float32, divided by the temperature."""
    # on oneDNN where it pays: 1.4x torch's product for a 1,024 x 1,024 tile at 896 inputs, where oneDNN's
    # gradients of a tile gained too little to keep (benchmarks/onednn_training.json)
    logits = linear_forward(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits.div_(temperature) if temperature != 1.0 else logits


def _tiles(n: int, vocab: int, row_group: int):
    """(row slice, vocabulary slice) tiles of at most TILE_ELEMENTS logits, row group by row group, so every
    weight-gradient row is written once per row group."""
    for row_start in range(0, n, row_group):
        rows = slice(row_start, min(row_start + row_group, n))
        width = max(MIN_TILE_COLUMNS, TILE_ELEMENTS // (rows.stop - rows.start))
        for col_start in range(0, vocab, width):
            yield rows, slice(col_start, min(col_start + width, vocab))


def _local_targets(targets: torch.Tensor, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows' targets fall in the tile's columns, and every target as a column of the tile (clamped)."""
    inside = (targets >= cols.start) & (targets < cols.stop)
    return inside, (targets - cols.start).clamp_(0, cols.stop - cols.start - 1)


class _OnlineStats:
    """Per-row log-sum-exp, entropy and chosen logit, accumulated over a row group's vocabulary tiles.

    With m the running max, S = sum exp(z - m) and D = sum exp(z - m)(z - m) over the tiles seen, a new max
    m' turns S into exp(m - m') S and D into exp(m - m')(D + (m - m') S); at the end lse = m + log S and
    H = log S - D / S (shifted sums keep the entropy's subtraction small).
    """

    def __init__(self, rows: int, dtype: torch.dtype, device: torch.device, with_entropy: bool):
        self.row_max: torch.Tensor | None = None
        self.sums = torch.zeros(rows, dtype=dtype, device=device)
        self.dots = torch.zeros_like(self.sums) if with_entropy else None
        self.chosen = torch.zeros_like(self.sums)

    def add(self, logits: torch.Tensor, inside: torch.Tensor, local_targets: torch.Tensor) -> None:
        """Fold one (rows, cols) tile in; the tile is overwritten."""
        self.chosen = torch.where(inside, logits.gather(-1, local_targets[:, None]).squeeze(-1), self.chosen)
        tile_max = logits.amax(-1)
        if self.row_max is None:
            new_max = tile_max
        else:
            new_max = torch.maximum(self.row_max, tile_max)
            step = self.row_max - new_max
            scale = step.exp()
            if self.dots is not None:
                self.dots.add_(step * self.sums).mul_(scale)
            self.sums.mul_(scale)
        self.row_max = new_max
        shifted = logits.sub_(new_max[:, None])
        if self.dots is None:
            self.sums += shifted.exp_().sum(-1)
            return
        e = shifted.exp()
        self.sums += e.sum(-1)
        self.dots += e.mul_(shifted).sum(-1)  # a batched dot product of a few rows is ~10x slower

    def results(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(log p of the targets, lse, entropy or None)."""
        log_sums = self.sums.log()
        lse = self.row_max + log_sums
        entropy = None if self.dots is None else log_sums - self.dots / self.sums
        return self.chosen - lse, lse, entropy


def _logit_grad(
    log_probs: torch.Tensor, targets, entropy, grad_logprobs, grad_entropy, onehot_grad
) -> torch.Tensor:
    """dL/dz for one tile, built in place in the block that holds log p on entry.

    dL/dz = -p * (g_lp + g_H (log p + H)) + onehot(y) g_lp; an unused output's gradient is None.
    `onehot_grad` is g_lp where the row's target falls in the tile's columns, else 0 (`targets` are local).
    """
    if grad_entropy is None:
        grad = log_probs.exp_().mul_(-grad_logprobs[:, None])
    else:
        p = log_probs.exp()
        grad = log_probs.add_(entropy[:, None]).mul_(grad_entropy[:, None])
        if grad_logprobs is not None:
            grad.add_(grad_logprobs[:, None])
        grad.mul_(p.neg_())
    if onehot_grad is not None:
        grad.scatter_add_(-1, targets[:, None], onehot_grad[:, None])
    return grad


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, row_group, with_entropy):
        n = hidden.shape[0]
        out_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logprobs = torch.empty(n, dtype=out_dtype, device=hidden.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.zeros_like(logprobs)
        stats = None
        for rows, cols in _tiles(n, weight.shape[0], row_group):
            if cols.start == 0:
                stats = _OnlineStats(rows.stop - rows.start, out_dtype, hidden.device, with_entropy)
            tile_bias = None if bias is None else bias[cols]
            logits = _chunk_logits(hidden[rows], weight[cols], tile_bias, temperature)
            stats.add(logits, *_local_targets(targets[rows], cols))
            del logits
            if cols.stop == weight.shape[0]:
                logprobs[rows], lse[rows], row_entropy = stats.results()
                if with_entropy:
                    entropy[rows] = row_entropy
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.row_group = temperature, row_group
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # an output nobody differentiates (a logged entropy) costs nothing
        return logprobs, entropy, lse

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, _grad_lse):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None, None
        acc = lse.dtype  # float32, or float64 for float64 inputs
        grads = _TileGrads(
            torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None,
            torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None,
            torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None,
        )
        for rows, cols in _tiles(hidden.shape[0], weight.shape[0], ctx.row_group):
            row_grads = (
                None if grad_logprobs is None else grad_logprobs[rows],
                None if grad_entropy is None else grad_entropy[rows],
            )
            _tile_backward(
                hidden[rows],
                weight,
                bias,
                targets[rows],
                lse[rows],
                entropy[rows],
                row_grads,
                ctx.temperature,
                rows,
                cols,
                grads,
            )
        grad_hidden = None if grads.hidden is None else grads.hidden.to(hidden.dtype)
        grad_weight = None if grads.weight is None else grads.weight.to(weight.dtype)
        grad_bias = None if grads.bias is None else grads.bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


class _TileGrads(NamedTuple):
    """Gradient accumulators (float32 or float64) that the tiles add into; None where not needed."""

    hidden: torch.Tensor | None
    weight: torch.Tensor | None
    bias: torch.Tensor | None


def _tile_backward(h, weight, bias, targets, lse, entropy, row_grads, temperature, rows, cols, grads):
    """Add one (rows, cols) tile's share of dL/dh, dL/dW[cols] and dL/db[cols] into `grads`."""
    grad_logprobs, grad_entropy = row_grads
    w = weight[cols]
    log_probs = _chunk_logits(h, w, None if bias is None else bias[cols], temperature).sub_(lse[:, None])
    # the one-hot term only for targets inside this tile's columns
    inside, local_targets = _local_targets(targets, cols)
    local_grad = None if grad_logprobs is None else grad_logprobs * inside
    grad = _logit_grad(log_probs, local_targets, entropy, grad_logprobs, grad_entropy, local_grad)
    del log_probs  # `grad` is the same block
    if temperature != 1.0:
        grad.div_(temperature)
    if grads.bias is not None:
        grads.bias[cols] += grad.sum(0)
    if grads.weight is not None:
        grads.weight[cols].addmm_(grad.t(), h.to(grads.weight.dtype))
    if grads.hidden is not None:
        grads.hidden[rows].addmm_(grad, w.to(grads.hidden.dtype))


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax((hidden W^T + b) / T)[target] per row, in (rows, vocabulary) tiles; differentiable.

    Args:
        hidden: (..., H) final hidden states (any leading dims).
        weight: (V, H) output-head weight; bias: (V,) or None.
        targets: (...) long token ids, the leading dims of `hidden`.
        temperature: logits are divided by it, as in sampling.
        chunk_rows: rows per row group (default ROW_GROUP); each group's tiles are about 4 MiB of logits.
        with_entropy: also return the entropy of softmax(logits / T) per row.
    Returns:
        logprobs (...) float32 (float64 for float64 inputs), or (logprobs, entropy) when `with_entropy`.
    """
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be (..., H) and weight {tuple(weight.shape)} (V, H)"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be (V,) = ({weight.shape[0]},)")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"targets {tuple(targets.shape)} must equal hidden's leading dims {tuple(hidden.shape[:-1])}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1).long()
    logprobs, entropy, _ = _ChunkedLogprobs.apply(
        flat_hidden, weight, bias, flat_targets, float(temperature), chunk_rows or ROW_GROUP, with_entropy
    )
    logprobs = logprobs.reshape(targets.shape)
    return (logprobs, entropy.reshape(targets.shape)) if with_entropy else logprobs
