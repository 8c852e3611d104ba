"""Chosen-token log-probabilities (and entropy) straight from final hidden states, without full logits.

The straightforward path projects every hidden row to the vocabulary, z = (h W^T + b) / T, keeps the
(N, V) logits alive for backward, and only then reads one value per row. Here the forward takes rows in
chunks: a chunk's logits are built in float32, reduced in place to per-row outputs and dropped, so memory
holds (N,) outputs plus one (chunk, V) block instead of (N, V). Backward rebuilds the logits from the
saved hidden states and weight (one extra matmul) rather than storing them, in (rows, vocabulary) tiles
of a few MiB: each tile writes its own rows of dL/dW, so beside that gradient only one small tile lives.

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

from rlhfkit.core.logprobs import rows_per_chunk

# forward: half the shared chunk budget, one (rows, V) float32 block of 32 MiB alive at a time (55 rows at a
# 152k vocabulary), the exponentials the entropy needs taken EXP_SLICE_ELEMENTS at a time beside it
CHUNK_SHARE = 2
EXP_SLICE_ELEMENTS = 1 << 18  # 1 MiB of float32
# backward: tiles of at most 4 MiB (a row group times at least MIN_TILE_COLUMNS vocabulary entries). At a 152k
# vocabulary, for 1,048 and 4,120 rows, 4, 8 and 16 MiB tiles took the same time, about half that of the row
# chunks of 32 MiB used before, which passed over all of dL/dW once per chunk
BACKWARD_TILE_ELEMENTS = 1 << 20
BACKWARD_ROW_GROUP = 4096
MIN_TILE_COLUMNS = 256


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    """(n, H) rows -> (n, V) logits, at least float32, divided by the temperature."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits.div_(temperature) if temperature != 1.0 else logits


def _row_slices(block: torch.Tensor):
    """Row slices of a (rows, V) block, each at most EXP_SLICE_ELEMENTS elements (at least one row)."""
    return block.split(max(1, EXP_SLICE_ELEMENTS // max(1, block.shape[-1])))


def _shifted_stats(logits: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row of `logits` (shifted in place to z - max): lse, and the entropy when asked.

    With s = z - max, S = sum exp(s): lse = max + log S and H = log S - sum(exp(s) s) / S.
    """
    row_max = logits.amax(-1, keepdim=True)
    shifted = logits.sub_(row_max)
    if not with_entropy:
        return shifted.exp_().sum(-1).log_().add_(row_max.squeeze(-1)), None
    sums, dots = [], []
    for part in _row_slices(shifted):
        e = part.exp()
        sums.append(e.sum(-1))
        dots.append(e.mul_(part).sum(-1))  # a batched dot product of a few rows is ~10x slower
    log_sum = torch.cat(sums).log_()
    return log_sum + row_max.squeeze(-1), log_sum - torch.cat(dots) / torch.cat(sums)


def _logit_grad(log_probs: torch.Tensor, targets, entropy, grad_logprobs, grad_entropy, onehot_grad) -> torch.Tensor:
    """dL/dz for one tile, built in place in the block that holds log p on entry.

    dL/dz = -p * (g_lp + g_H (log p + H)) + onehot(y) g_lp; an unused output's gradient is None.
    `onehot_grad` is g_lp where the row's target falls in the tile's columns, else 0 (`targets` are local).
    """
    if grad_entropy is None:
        grad = log_probs.exp_().mul_(-grad_logprobs[:, None])
    else:
        grad, start = log_probs, 0
        for part in _row_slices(log_probs):
            rows = slice(start, start + part.shape[0])
            start = rows.stop
            p = part.exp()
            part.add_(entropy[rows, None]).mul_(grad_entropy[rows, None])
            if grad_logprobs is not None:
                part.add_(grad_logprobs[rows, None])
            part.mul_(p.neg_())
    if onehot_grad is not None:
        grad.scatter_add_(-1, targets[:, None], onehot_grad[:, None])
    return grad


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, rows, with_entropy):
        n = hidden.shape[0]
        out_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logprobs = torch.empty(n, dtype=out_dtype, device=hidden.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.zeros_like(logprobs)
        for start in range(0, n, rows):
            end = min(start + rows, n)
            logits = _chunk_logits(hidden[start:end], weight, bias, temperature)
            chosen = logits.gather(-1, targets[start:end, None]).squeeze(-1)
            lse[start:end], chunk_entropy = _shifted_stats(logits, with_entropy)  # overwrites the block
            logprobs[start:end] = chosen - lse[start:end]
            if with_entropy:
                entropy[start:end] = chunk_entropy
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature = temperature
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
        vocab = weight.shape[0]
        for rows, cols in _backward_tiles(hidden.shape[0], vocab):
            row_grads = (
                None if grad_logprobs is None else grad_logprobs[rows],
                None if grad_entropy is None else grad_entropy[rows],
            )
            _tile_backward(hidden[rows], weight, bias, targets[rows], lse[rows], entropy[rows], row_grads,
                           ctx.temperature, rows, cols, grads)
        grad_hidden = None if grads.hidden is None else grads.hidden.to(hidden.dtype)
        grad_weight = None if grads.weight is None else grads.weight.to(weight.dtype)
        grad_bias = None if grads.bias is None else grads.bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


class _TileGrads(NamedTuple):
    """Gradient accumulators (float32 or float64) that the tiles add into; None where not needed."""

    hidden: torch.Tensor | None
    weight: torch.Tensor | None
    bias: torch.Tensor | None


def _backward_tiles(n: int, vocab: int):
    """(row slice, vocabulary slice) tiles of at most BACKWARD_TILE_ELEMENTS logits (a row group of up to
    BACKWARD_ROW_GROUP rows times at least MIN_TILE_COLUMNS tokens); every weight-gradient row is written
    once per row group instead of once per row chunk."""
    for row_start in range(0, n, BACKWARD_ROW_GROUP):
        rows = slice(row_start, min(row_start + BACKWARD_ROW_GROUP, n))
        width = max(MIN_TILE_COLUMNS, BACKWARD_TILE_ELEMENTS // (rows.stop - rows.start))
        for col_start in range(0, vocab, width):
            yield rows, slice(col_start, min(col_start + width, vocab))


def _tile_backward(h, weight, bias, targets, lse, entropy, row_grads, temperature, rows, cols, grads):
    """Add one (rows, cols) tile's share of dL/dh, dL/dW[cols] and dL/db[cols] into `grads`."""
    grad_logprobs, grad_entropy = row_grads
    w = weight[cols]
    log_probs = _chunk_logits(h, w, None if bias is None else bias[cols], temperature).sub_(lse[:, None])
    # the one-hot term only for targets inside this tile's columns
    inside = (targets >= cols.start) & (targets < cols.stop)
    local_targets = (targets - cols.start).clamp_(0, cols.stop - cols.start - 1)
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
    """log softmax((hidden W^T + b) / T)[target] per row, in row chunks; differentiable.

    Args:
        hidden: (..., H) final hidden states (any leading dims).
        weight: (V, H) output-head weight; bias: (V,) or None.
        targets: (...) long token ids, the leading dims of `hidden`.
        temperature: logits are divided by it, as in sampling.
        chunk_rows: rows per chunk; default keeps a float32 chunk of logits near 32 MiB.
        with_entropy: also return the entropy of softmax(logits / T) per row.
    Returns:
        logprobs (...) float32 (float64 for float64 inputs), or (logprobs, entropy) when `with_entropy`.
    """
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be (..., H) and weight {tuple(weight.shape)} (V, H)")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be (V,) = ({weight.shape[0]},)")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must equal hidden's leading dims {tuple(hidden.shape[:-1])}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    rows = rows_per_chunk(weight.shape[0], chunk_rows, share=CHUNK_SHARE)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1).long()
    logprobs, entropy, _ = _ChunkedLogprobs.apply(
        flat_hidden, weight, bias, flat_targets, float(temperature), rows, with_entropy
    )
    logprobs = logprobs.reshape(targets.shape)
    return (logprobs, entropy.reshape(targets.shape)) if with_entropy else logprobs
