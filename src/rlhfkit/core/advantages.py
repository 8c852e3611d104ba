"""Advantage estimators: GAE for PPO, the leave-one-out baseline for RLOO.

GAE (Schulman et al. 2016) runs over the response tokens. Positions where `mask` is False are
skipped: they get zero advantage and return, and neither their reward nor their value reaches
earlier steps (for right-padded responses the episode simply ends at the last real token, with a
bootstrap value of 0). RLOO (Ahmadian et al. 2024) treats a whole completion as one action.
"""

from __future__ import annotations

import torch

from rlhfkit.core.masking import masked_whiten


def compute_gae(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation.

    values, rewards, mask: (B, T). Returns (advantages, returns), both (B, T), with
    returns = advantages + values on real tokens and 0 elsewhere. No gradient flows.
    """
    if values.shape != rewards.shape or values.shape != mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)}, rewards {tuple(rewards.shape)} and mask {tuple(mask.shape)} "
            "must have the same (batch, length) shape"
        )
    with torch.no_grad():
        mask = mask.bool()
        values = values.float()
        rewards = rewards.float()
        advantages = torch.zeros_like(values)
        last_gae = values.new_zeros(values.shape[0])
        next_value = values.new_zeros(values.shape[0])
        for t in reversed(range(values.size(1))):
            real = mask[:, t]
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            # a masked position passes the carried quantities through untouched
            last_gae = torch.where(real, gae, last_gae)
            next_value = torch.where(real, values[:, t], next_value)
            advantages[:, t] = torch.where(real, gae, 0.0)
        returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def whitened_gae(
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten_rewards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's estimator: GAE, then advantages whitened over the real tokens (when there are two or more).

    `whiten_rewards` first rescales the rewards (mean kept: their sign carries meaning). All (B, T);
    returns (advantages, returns), detached, advantages zero on masked positions.
    """
    if whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    advantages, returns = compute_gae(values, rewards, mask, gamma, lam)
    if mask.sum() >= 2:  # whitening needs a variance
        advantages = masked_whiten(advantages, mask) * mask
    return advantages.detach(), returns.detach()


def rloo_advantages(rlhf_reward: torch.Tensor, rloo_k: int) -> torch.Tensor:
    """Reward minus the mean reward of the other k-1 completions of the same prompt.

    rlhf_reward: (k*B,), laid out so that the k completions of prompt i sit at i, i+B, ..., i+(k-1)B
    (k generation rounds over the same B prompts, concatenated). Returns (k*B,).
    """
    if rloo_k < 2:
        raise ValueError(f"rloo_k must be >= 2 for a leave-one-out baseline, got {rloo_k}")
    if rlhf_reward.dim() != 1:
        raise ValueError(f"rlhf_reward must be 1-D (k*B,), got shape {tuple(rlhf_reward.shape)}")
    if rlhf_reward.numel() % rloo_k != 0:
        raise ValueError(f"rlhf_reward has {rlhf_reward.numel()} entries, not divisible by rloo_k={rloo_k}")
    grouped = rlhf_reward.reshape(rloo_k, -1)  # (k, B): column i holds prompt i's completions
    baseline = (grouped.sum(0, keepdim=True) - grouped) / (rloo_k - 1)
    return (grouped - baseline).flatten()

