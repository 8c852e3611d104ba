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


def _row_chunks(tensors: tuple[torch.Tensor, ...], rows: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """The same chunk of at most `rows` rows from each of `tensors` (..., k_i), which share their
    leading dims: views, in order.

    A slice such as `logits[:, :-1]` (every position but the last) has no flat (rows, k) view, and `reshape`
    would copy all of it: the (B, T, V) copy the chunking exists to avoid. Then the tensors are split along
    their first dimension instead, whole leading entries at a time, or one entry at a time when one is
    too large.
    """
    try:
        flats = [t.view(-1, t.size(-1)) for t in tensors]
    except RuntimeError:
        per_entry = max(1, math.prod(tensors[0].shape[1:-1]))  # rows under one index of the first dimension
        if per_entry <= rows:
            yield from zip(*(t.split(rows // per_entry) for t in tensors))
        else:
            for entries in zip(*(t.unbind(0) for t in tensors)):
                yield from _row_chunks(entries, rows)
        return
    # `split`, not slicing: the backward of one slice allocates a zero tensor as large as all the logits,
    # once per chunk; that of `split` (and of `unbind` above) assembles the gradient once
    yield from zip(*(flat.split(rows) for flat in flats))


def _map_rows(
    fn: Callable[..., torch.Tensor], chunk_rows: int | None, logits: torch.Tensor, *aligned: torch.Tensor
) -> torch.Tensor:
    """Apply fn(float32 chunk (..., V), *the same rows of `aligned`) -> (...) over the rows of logits (..., V)
    -> (...) float32. Each of `aligned` has logits' leading dims."""
    rows = rows_per_chunk(logits.size(-1), chunk_rows)
    parts = [fn(chunk.float(), *rest).reshape(-1) for chunk, *rest in _row_chunks((logits, *aligned), rows)]
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

    def chunk_logprobs(chunk: torch.Tensor, chunk_index: torch.Tensor) -> torch.Tensor:
        return chunk.gather(-1, chunk_index).squeeze(-1) - torch.logsumexp(chunk, dim=-1)

    return _map_rows(chunk_logprobs, chunk_rows, logits, index.unsqueeze(-1))


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(l) - sum(softmax(l) * l).

    logits: (B, T, V) (any leading dims) -> (B, T) float32.
    """

    def chunk_entropy(chunk: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(chunk, dim=-1) - (torch.softmax(chunk, dim=-1) * chunk).sum(-1)

    return _map_rows(chunk_entropy, chunk_rows, logits)


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

    def chunk_kl(chunk: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(chunk, dim=-1)
        return (logp.exp() * (logp - torch.log_softmax(ref.float(), dim=-1))).sum(-1)

    return _map_rows(chunk_kl, chunk_rows, logits, ref_logits)
