"""Masked statistics and response masks.

A mask is True/1 for a real token. `masked_whiten` follows the PPO-for-LM practice (Ziegler et al.
2019, "N implementation details of RLHF") of whitening over all real tokens of the batch; the
variance it uses is the unbiased one, as in those implementations, and positions outside the mask
are whitened with the same statistics but never contribute to them.
"""

from __future__ import annotations

import torch


def _check_same_shape(values: torch.Tensor, mask: torch.Tensor) -> None:
    if values.shape != mask.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal values shape {tuple(values.shape)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is true.

    values, mask: same shape (e.g. (B, T)). dim=None -> scalar; otherwise the mean along `dim`
    (a row with no real token gives nan).
    """
    _check_same_shape(values, mask)
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim) / mask.sum(dim)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over all real positions -> scalar.

    unbiased=True applies Bessel's correction n/(n-1), which needs at least two real tokens.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n.item() < 2:  # one sync; the correction is undefined otherwise
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 real tokens, the mask has {int(n)}")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor | None, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / std with statistics over real tokens; same shape as `values`.

    The one batch standardisation of the library (PPO advantages, RLOO rewards and advantages, DDPO
    scores): mask=None uses every entry. The std is the unbiased one, so at least two real entries
    are needed. shift_mean=False adds the mean back (only the scale changes): used for rewards, whose
    sign carries meaning.
    """
    if mask is None:
        mask = torch.ones_like(values, dtype=torch.bool)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim.

    bools: (B, T) bool -> (B,) long; T for a row with no True.
    """
    if bools.dtype != torch.bool:
        raise TypeError(f"first_true_indices expects a bool tensor, got {bools.dtype}")
    length = bools.size(-1)
    if length == 0:  # no positions at all: every row has "no True", i.e. index T = 0
        return torch.zeros(bools.shape[:-1], dtype=torch.long, device=bools.device)
    positions = torch.arange(length, device=bools.device)
    # a False position is pushed to >= length, so the row minimum is the first True (or length)
    candidates = positions + length * (~bools).long()
    return candidates.min(dim=-1).values


def last_true_indices(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row: (B, T) -> (B,) long; -1 for a row without any."""
    length = mask.size(-1)
    return length - 1 - first_true_indices(mask.bool().flip(-1))


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions counting only real tokens; padding gets position 0."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp_(min=0)


def truncate_at_stop(
    responses: torch.Tensor, stop_token_id: int | None, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut responses after their first stop token.

    responses: (B, T) long. Returns (responses, response_mask), both (B, T). The first stop token is
    kept (mask True); every later token becomes `pad_token_id` (mask False). A row without a stop
    token is kept whole. With stop_token_id=None nothing is rewritten and the mask ends before the
    first pad token (the shape `generate` leaves behind).
    """
    if responses.dim() != 2:
        raise ValueError(f"responses must be (batch, length), got shape {tuple(responses.shape)}")
    positions = torch.arange(responses.size(1), device=responses.device)
    if stop_token_id is None:
        first_pad = first_true_indices(responses == pad_token_id)
        return responses, positions[None, :] < first_pad[:, None]
    first_stop = first_true_indices(responses == stop_token_id)
    response_mask = positions[None, :] <= first_stop[:, None]
    return responses.masked_fill(~response_mask, pad_token_id), response_mask
