"""Off-policy sequence masking (DeepSeek-V3.2, arXiv:2512.02556, eq. 9; TRL's `off_policy_mask_threshold`).

A completion sampled by an older (or a different, inference-engine) policy whose tokens the current policy
now finds much less likely is dropped from the policy loss when its advantage is negative: pushing its
probability further down teaches little and destabilises training. The drift is the mean over the
completion's tokens of log pi_sampling - log pi_current, a sample estimate of KL(pi_sampling || pi).
"""

from __future__ import annotations

import torch


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """(N,) bool, True = keep: advantage >= 0, or mean drift <= threshold.

    advantages: (N,); logprobs (current), sampling_logprobs, loss_mask: (N, T). A NaN sampling logprob (a
    token the sampler could not score) counts as no drift; a row without loss tokens has drift 0.
    """
    if logprobs.shape != sampling_logprobs.shape or logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, sampling_logprobs {tuple(sampling_logprobs.shape)} and "
            f"loss_mask {tuple(loss_mask.shape)} must have the same (N, T) shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (N,) = ({logprobs.size(0)},), got {tuple(advantages.shape)}")
    mask = loss_mask.to(logprobs.dtype)
    drift = torch.nan_to_num(sampling_logprobs.detach() - logprobs.detach(), nan=0.0)
    mean_drift = (drift * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return (advantages >= 0) | (mean_drift <= threshold)
