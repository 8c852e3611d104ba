"""The RLHF reward of RLOO: the score minus the KL penalty, per sequence or per token.

The scores themselves come from `rlhfkit.rollout.rewards.RewardScorer`, shared with every trainer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhfkit.core import clip_tensor, compute_token_rewards, kl_penalty, masked_whiten


def normalize_scores(scores: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Reinforce++ `normalize_reward`: standardise the raw scores (N,) of a batch, then clip to ±clip_range.

    Applied to the scores before the KL term is added, so the KL penalty keeps its kl_coef scale.
    """
    return clip_tensor(masked_whiten(scores, None), clip_range)


def sequence_level_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One KL penalty per completion: score - kl_coef * sum_t kl_t.

    Returns (rlhf_reward (N,), non_score_reward (N,), kl (N, T) zero on padding).
    """
    kl = torch.where(response_mask.bool(), kl_penalty(logprobs, ref_logprobs, "kl"), 0.0)
    non_score_reward = -kl_coef * kl.sum(1)
    return scores + non_score_reward, non_score_reward, kl


def token_level_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reinforce++ eq. (1): -kl_coef * kl_t per token plus the score on the last real token, summed."""
    rewards, non_score_rewards, kl = compute_token_rewards(
        scores, logprobs, ref_logprobs, response_mask, kl_coef
    )
    return rewards.sum(1), non_score_rewards.sum(1), kl


# config.token_level_kl -> how the KL penalty enters the reward
RLHF_REWARDS: dict[bool, Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
    False: sequence_level_rlhf_reward,
    True: token_level_rlhf_reward,
}


def compute_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    token_level_kl: bool = False,
    normalize_clip_range: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RLOO's reward per completion: score - kl_coef * KL, the score first normalised when asked.

    `normalize_clip_range` set (Reinforce++ `normalize_reward`) standardises and clips the raw scores (N,)
    before the KL term is added. Returns (rlhf_reward (N,), non_score_reward (N,), kl (N, T)).
    """
    if normalize_clip_range is not None:
        scores = normalize_scores(scores, normalize_clip_range)
    return RLHF_REWARDS[token_level_kl](scores, logprobs, ref_logprobs, response_mask, kl_coef)
