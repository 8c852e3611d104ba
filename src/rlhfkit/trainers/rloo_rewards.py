"""The RLHF reward of RLOO: the score minus the KL penalty, one reward per completion.

The KL penalty is taken per completion or, Reinforce++ style, per token and then summed over the completion.

The scores themselves come from `rlhfkit.rollout.rewards.RewardScorer`, shared with every trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlhfkit.core import clip_tensor, compute_token_rewards, kl_penalty, masked_whiten


def normalize_scores(scores: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Reinforce++ `normalize_reward`: standardise the raw scores (N,) of a batch, then clip to ±clip_range.

    Applied to the scores before the KL term is added, so the KL penalty keeps its kl_coef scale.
    """
    return clip_tensor(masked_whiten(scores, None), clip_range)


class RLHFReward(NamedTuple):
    """RLOO's reward of each of N completions, with its parts."""

    reward: torch.Tensor  # (N,) score - kl_coef * KL: what the leave-one-out baseline acts on
    non_score_reward: torch.Tensor  # (N,) the KL part alone
    kl: torch.Tensor  # (N, T) per-token KL estimate, zero on padding


def sequence_kl_reward(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                       response_mask: torch.Tensor, kl_coef: float) -> RLHFReward:
    """One KL penalty per completion: score - kl_coef * sum_t kl_t."""
    kl = torch.where(response_mask.bool(), kl_penalty(logprobs, ref_logprobs, "kl"), 0.0)
    non_score_reward = -kl_coef * kl.sum(1)
    return RLHFReward(scores + non_score_reward, non_score_reward, kl)


def summed_token_rewards(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         response_mask: torch.Tensor, kl_coef: float) -> RLHFReward:
    """Reinforce++ eq. (1) per-token rewards (-kl_coef * kl_t, plus the score on the last real token),
    summed over each completion: RLOO's advantage is one number per completion. Equal to
    `sequence_kl_reward` up to float rounding (the sums are taken in another order).
    """
    rewards, non_score_rewards, kl = compute_token_rewards(scores, logprobs, ref_logprobs, response_mask, kl_coef)
    return RLHFReward(rewards.sum(1), non_score_rewards.sum(1), kl)


# config.token_level_kl -> where the KL penalty is applied (per completion or per token); both give (N,) rewards
RLHF_REWARDS: dict[bool, Callable[..., RLHFReward]] = {
    False: sequence_kl_reward,
    True: summed_token_rewards,
}


def compute_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    token_level_kl: bool = False,
    normalize_clip_range: float | None = None,
) -> RLHFReward:
    """RLOO's reward per completion: score - kl_coef * KL, the score first normalised when asked.

    `normalize_clip_range` set (Reinforce++ `normalize_reward`) standardises and clips the raw scores (N,)
    before the KL term is added.
    """
    if normalize_clip_range is not None:
        scores = normalize_scores(scores, normalize_clip_range)
    return RLHF_REWARDS[token_level_kl](scores, logprobs, ref_logprobs, response_mask, kl_coef)
