"""Importance weights for the sampler/trainer mismatch (TRL's `vllm_importance_sampling_*`).

The completions are drawn by a sampler (an inference engine, a KV-cached decode loop, another dtype)
whose logprobs differ from those the training forward pass gives the same tokens, so the policy
gradient is taken on samples of a slightly different policy. The weight w = pi_old / pi_sampler,
with pi_old the training policy when the completions were drawn, re-weights each sampled token (or
each sequence) toward the training policy; as in TRL it multiplies the policy term of the per-token
loss, not the KL term. Two ways to bound it (Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training"):

  truncate  w <- clamp(w, clip_min, clip_max)       (truncated importance sampling)
  mask      w <- 0 where w < clip_min or w > clip_max (masked importance sampling)

At token level w_t = exp(old_t - sampler_t); at sequence level one w = exp(sum_t (old_t - sampler_t))
over the sequence's loss tokens (the product of its token ratios, not GSPO's length-normalised mean),
broadcast to every token. A missing bound (None) does not bound that side.

Departure from TRL, for finite numbers: a NaN sampler logprob counts as no gap (as TRL), an infinite
gap and any log-ratio are clamped to [-20, 20] before the exponential (VESPO's clamp in TRL), so
w never overflows; with a clip_max below e^20 nothing else changes.
"""

from __future__ import annotations

import torch

SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LOG_RATIO_LIMIT = 20.0


def sampler_log_ratios(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, loss_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log(pi_old / pi_sampler): (N, T) at level "token" (0 off the mask), (N, 1) at "sequence" (the
    masked sum per row). old_logprobs, sampling_logprobs, loss_mask: (N, T). Clamped to +-20."""
    if old_logprobs.shape != sampling_logprobs.shape or old_logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)}, sampling_logprobs {tuple(sampling_logprobs.shape)} "
            f"and loss_mask {tuple(loss_mask.shape)} must have the same (N, T) shape"
        )
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    gap = old_logprobs.detach().float() - sampling_logprobs.detach().float()
    gap = torch.nan_to_num(gap, nan=0.0, posinf=LOG_RATIO_LIMIT, neginf=-LOG_RATIO_LIMIT)
    gap = torch.where(loss_mask.bool(), gap.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), torch.zeros_like(gap))
    if level == "sequence":
        gap = gap.sum(-1, keepdim=True)
    return gap.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def sampler_importance_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """(N, T) float32 detached weights of `mode` (see the module docstring), sequence modes broadcast to
    every column; 1 on tokens off `loss_mask` at token level. old_logprobs: the training policy's
    logprobs of the sampled tokens at sampling time; sampling_logprobs: the sampler's; both (N, T)."""
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"mode must be one of {', '.join(SAMPLER_CORRECTION_MODES)}; got {mode!r}")
    level, bound = mode.split("_")
    ratio = torch.exp(sampler_log_ratios(old_logprobs, sampling_logprobs, loss_mask, level))
    if bound == "truncate":
        ratio = ratio.clamp(min=clip_min, max=clip_max)
    else:
        outside = torch.zeros_like(ratio, dtype=torch.bool)
        if clip_min is not None:
            outside |= ratio < clip_min
        if clip_max is not None:
            outside |= ratio > clip_max
        ratio = ratio.masked_fill(outside, 0.0)
    return ratio.expand(loss_mask.shape)


def importance_weight_stats(weights: torch.Tensor, loss_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(3,) min, mean, max of the weights TRL reports: every row's one weight in sequence modes, the
    loss tokens' in token modes; NaN where there is nothing to summarise (no rows / no loss tokens)."""
    if mode.startswith("sequence"):
        values = weights[:, 0] if weights.size(-1) else weights.new_zeros(0)
    else:
        values = weights[loss_mask.bool()]
    if values.numel() == 0:
        return torch.full((3,), float("nan"), device=weights.device)
    values = values.float()
    return torch.stack([values.min(), values.mean(), values.max()])
