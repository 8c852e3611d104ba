"""Per-sequence reweightings of DPO's log-probs: LD-DPO's length desensitisation and WPO's pair weights.

Both read a (2B, T) block of per-token log-probs whose first B rows are the chosen responses and last B
rows the rejected ones (the concatenated DPO batch), with a mask that is True on response tokens.

LD-DPO (Liu et al. 2024): the first min(len_chosen, len_rejected) response tokens of each side count in
full, the rest ("verbose" tail) with weight alpha; alpha = 1 is plain DPO, alpha = 0 cuts both sides to
the shorter length.
WPO (Zhou et al. 2024, eq. 2): a pair is weighted by w(chosen) * w(rejected), where w(y) is the geometric
mean over y's tokens of p(y_t) / sum_v p(v)^2, the token's probability relative to the policy's own
expected probability of a sample; the weights carry no gradient.
"""

from __future__ import annotations

import torch


def length_desensitised_logps(token_logps: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """LD-DPO's sequence log-probs: the shared-length part in full plus alpha times the tail.

    token_logps, mask: (2B, T), rows [chosen_1..chosen_B, rejected_1..rejected_B]; mask True on response
    tokens (they need not be contiguous from the left). Returns (2B,).
    """
    if token_logps.shape != mask.shape or token_logps.shape[0] % 2:
        raise ValueError(
            f"token_logps {tuple(token_logps.shape)} and mask {tuple(mask.shape)} must share one (2B, T) "
            "shape"
        )
    mask = mask.bool()
    position = mask.long().cumsum(1)  # 1, 2, ... at the response tokens
    chosen_len, rejected_len = mask.sum(1).chunk(2)
    shared = torch.minimum(chosen_len, rejected_len).repeat(2).unsqueeze(1)
    in_shared = mask & (position <= shared)
    in_tail = mask & (position > shared)
    return (token_logps * in_shared).sum(1) + alpha * (token_logps * in_tail).sum(1)


def log_sum_squared_probs(logits: torch.Tensor) -> torch.Tensor:
    """log sum_v softmax(logits)_v^2 = logsumexp(2 z) - 2 logsumexp(z): (..., V) -> (...)."""
    logits = logits.float()
    return torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1)


def wpo_pair_weights(token_logps: torch.Tensor, log_sum_sq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """WPO's weight of each pair, w(chosen) * w(rejected), without gradient.

    token_logps, log_sum_sq, mask: (2B, T), chosen rows first; w(y) = exp(mean over y's response tokens of
    (log p(y_t) - log sum_v p(v)^2)). Returns (B,).
    """
    with torch.no_grad():
        mask = mask.to(token_logps.dtype)
        aligned = ((token_logps - log_sum_sq) * mask).sum(1) / mask.sum(1).clamp(min=1)
        chosen, rejected = aligned.exp().chunk(2)
        return chosen * rejected
