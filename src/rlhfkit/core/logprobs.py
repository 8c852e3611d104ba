"""Log-probabilities of chosen tokens and entropies, straight from logits.

log p(token) = logit[token] - logsumexp(logits): no full log-softmax copy of the vocabulary is
materialised. Rows are processed in chunks, and half-precision chunks are upcast to float32 one
chunk at a time, so peak extra memory is one float32 chunk rather than a (B, T, V) copy.
Outputs are always float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

# one float32 chunk of logits is about 64 MiB, whatever the vocabulary size
CHUNK_ELEMENTS = 1 << 24


def rows_per_chunk(vocab_size: int, chunk_rows: int | None) -> int:
    """`chunk_rows` when given, else as many rows as fit CHUNK_ELEMENTS logits."""
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        return chunk_rows
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def _row_chunks(logits: torch.Tensor, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, chunk (..., V) of at most `rows` rows): views covering the rows of logits in order.

    A slice such as `logits[:, :-1]` (every position but the last) has no flat (rows, V) view, and `reshape`
    would copy all of it: the (B, T, V) copy the chunking exists to avoid. Such a tensor is split along its
    first dimension instead, whole leading entries at a time, or one entry at a time when one is too large.
    """
    try:
        flat = logits.view(-1, logits.size(-1))
    except RuntimeError:
        per_entry = max(1, math.prod(logits.shape[1:-1]))  # rows under one index of the first dimension
        if per_entry <= rows:
            entries = rows // per_entry
            for i, part in enumerate(logits.split(entries)):
                yield i * entries * per_entry, part
        else:
            for i, entry in enumerate(logits.unbind(0)):
                for start, chunk in _row_chunks(entry, rows):
                    yield i * per_entry + start, chunk
        return
    # `split`, not slicing: the backward of one slice allocates a zero tensor as large as all the logits,
    # once per chunk; that of `split` (and of `unbind` above) assembles the gradient once
    for i, chunk in enumerate(flat.split(rows)):
        yield i * rows, chunk


def _rows_like(flat: torch.Tensor, start: int, chunk: torch.Tensor) -> torch.Tensor:
    """The rows of `flat` (rows, k) that line up with `chunk` (..., V), shaped (..., k)."""
    return flat[start : start + chunk.numel() // chunk.size(-1)].view(*chunk.shape[:-1], flat.size(-1))


def _map_rows(
    logits: torch.Tensor, fn: Callable[[int, torch.Tensor], torch.Tensor], chunk_rows: int | None
) -> torch.Tensor:
    """Apply fn(first row, float32 chunk (..., V)) -> (...) over the rows of logits (..., V) -> (...) float32."""
    rows = rows_per_chunk(logits.size(-1), chunk_rows)
    parts = [fn(start, chunk.float()).reshape(-1) for start, chunk in _row_chunks(logits, rows)]
    out = torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, chunk_rows: int | None = None
) -> torch.Tensor:
    """log softmax(logits)[index] for every position.

    logits: (B, T, V) (any leading dims), index: (B, T) long -> (B, T) float32. Differentiable.
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(
            f"index shape {tuple(index.shape)} must equal logits shape without the vocab dim "
            f"{tuple(logits.shape[:-1])}"
        )
    flat_index = index.reshape(-1, 1)

    def chunk_logprobs(start: int, chunk: torch.Tensor) -> torch.Tensor:
        chosen = chunk.gather(-1, _rows_like(flat_index, start, chunk)).squeeze(-1)
        return chosen - torch.logsumexp(chunk, dim=-1)

    return _map_rows(logits, chunk_logprobs, chunk_rows)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(l) - sum(softmax(l) * l).

    logits: (B, T, V) (any leading dims) -> (B, T) float32.
    """

    def chunk_entropy(_start: int, chunk: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(chunk, dim=-1) - (torch.softmax(chunk, dim=-1) * chunk).sum(-1)

    return _map_rows(logits, chunk_entropy, chunk_rows)


def full_kl_from_logits(
    logits: torch.Tensor, ref_logits: torch.Tensor, chunk_rows: int | None = None
) -> torch.Tensor:
    """Exact KL(p || p_ref) over the vocabulary per position.

    logits, ref_logits: (B, T, V) -> (B, T) float32. Chunked like the functions above.
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(
            f"ref_logits shape {tuple(ref_logits.shape)} must equal logits {tuple(logits.shape)}"
        )
    flat_ref = ref_logits.reshape(-1, ref_logits.size(-1))

    def chunk_kl(start: int, chunk: torch.Tensor) -> torch.Tensor:
        ref = _rows_like(flat_ref, start, chunk).float()
        logp = torch.log_softmax(chunk, dim=-1)
        return (logp.exp() * (logp - torch.log_softmax(ref, dim=-1))).sum(-1)

    return _map_rows(logits, chunk_kl, chunk_rows)
