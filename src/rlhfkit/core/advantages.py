"""Advantage estimators: GAE for PPO, group-relative ones for GRPO and RLOO.

GAE (Schulman et al. 2016) runs over the response tokens. Positions where `mask` is False are
skipped: they get zero advantage and return, and neither their reward nor their value reaches
earlier steps (for right-padded responses the episode simply ends at the last real token, with a
bootstrap value of 0).

`group_advantages` serves every trainer that samples a group of G completions per prompt, always on
consecutive rows, and compares them with each other: GRPO (Shao et al. 2024) against the group mean,
RLOO (Ahmadian et al. 2024) against the mean of the other G-1, each completion one action. A NaN
reward ("no reward function applied") is left out of every mean and std and gets advantage 0. Stds
are unbiased (Bessel), plus 1e-4, as TRL's GRPO.
"""

from __future__ import annotations

from collections.abc import Callable

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


_STD_EPS = 1e-4  # TRL GRPO's epsilon, added to the std before dividing


def _nan_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std ignoring NaNs (NaN where fewer than two values are present), keepdim."""
    dims = tuple(range(values.dim())) if dim is None else (dim,)
    mean = torch.nanmean(values, dim=dims, keepdim=True)
    count = (~values.isnan()).sum(dim=dims, keepdim=True)
    sum_sq = ((values - mean) ** 2).nansum(dim=dims, keepdim=True)
    return (sum_sq / (count - 1).clamp(min=1)).sqrt().masked_fill(count < 2, float("nan"))


def _group_mean_baseline(grouped: torch.Tensor) -> torch.Tensor:
    """(B, G) -> r - mean of its group (Shao et al. 2024)."""
    return grouped - torch.nanmean(grouped, dim=1, keepdim=True)


def _leave_one_out_baseline(grouped: torch.Tensor) -> torch.Tensor:
    """(B, G) -> r - mean of the other G-1 rewards of its group (Ahmadian et al. 2024)."""
    present = ~grouped.isnan()
    others_sum = grouped.nansum(dim=1, keepdim=True) - grouped
    others_count = present.sum(dim=1, keepdim=True).to(grouped.dtype) - 1
    # a group with a single scored completion has no baseline: NaN, turned into advantage 0 later
    return grouped - others_sum / others_count.clamp(min=1).masked_fill(others_count < 1, float("nan"))


# name -> fn(grouped rewards (B, G)) -> advantages (B, G) before `scale_rewards`
ADVANTAGE_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "group_mean": _group_mean_baseline,
    "rloo": _leave_one_out_baseline,
}

# scale_rewards -> fn(grouped rewards (B, G)) -> std to divide by (broadcastable), or None
_REWARD_SCALES: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "group": lambda grouped: _nan_std(grouped, dim=1),
    "batch": lambda grouped: _nan_std(grouped),
    "none": lambda grouped: None,
}


def group_advantages(
    rewards: torch.Tensor, group_size: int, estimator: str = "group_mean", scale_rewards: str = "group"
) -> torch.Tensor:
    """Group-relative advantages for GRPO-style training.

    rewards: (N,) with N = B * group_size, group g in rows g*G .. g*G+G-1 (NaN = unscored).
    estimator: a key of ADVANTAGE_ESTIMATORS. scale_rewards: "group" divides by the std of the raw
    rewards of each group, "batch" by their std over the whole batch (+1e-4 both), "none" keeps
    the scale.
    Returns (N,), detached; 0 where the reward is NaN or the advantage is undefined (too few scored rewards in
    the group, or the batch, for its baseline or std). Infinite rewards, and huge ones whose mean or std
    overflows, give non-finite advantages, never a silent 0: the trainers' non-finite check skips that update.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    if scale_rewards not in _REWARD_SCALES:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; valid: {', '.join(_REWARD_SCALES)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    if group_size < 2 and (estimator == "rloo" or scale_rewards == "group"):
        raise ValueError(
            f"group_size must be >= 2 for estimator={estimator!r} with scale_rewards={scale_rewards!r}, "
            f"got {group_size}"
        )
    with torch.no_grad():
        dtype = torch.promote_types(rewards.dtype, torch.float32)  # float64 stays float64
        grouped = rewards.detach().to(dtype).reshape(-1, group_size)
        advantages = ADVANTAGE_ESTIMATORS[estimator](grouped)
        std = _REWARD_SCALES[scale_rewards](grouped)
        if std is not None:  # an overflowed (infinite) std would turn every advantage into 0: NaN instead
            advantages = advantages / (std + _STD_EPS).masked_fill(std.isinf(), float("nan"))
        present = ~grouped.isnan()
        in_group = 2 if estimator == "rloo" or scale_rewards == "group" else 1
        in_batch = 2 if scale_rewards == "batch" else 1
        defined = present & (present.sum(1, keepdim=True) >= in_group) & (present.sum() >= in_batch)
    return torch.where(defined, advantages, 0.0).flatten()


def decoupled_group_advantages(
    per_source: torch.Tensor, weights: torch.Tensor, group_size: int
) -> torch.Tensor:
    """GDPO's advantages for several rewards (arXiv:2601.05242): normalise each reward within its group, sum
    them with their weights, then standardise the sum over the batch. TRL's
    `multi_objective_aggregation="normalize_then_sum"` (it ignores `scale_rewards`).

    per_source: (S, N), source s's reward of row n, NaN where it does not apply; groups of `group_size` on
    consecutive rows. weights: (S,). Each source: (r - group mean) / (group std + 1e-4), over its scored
    rows (NaN with fewer than two, then left out of the sum); the weighted sum of a row: over the sources
    that apply; then (x - batch mean) / (batch std + 1e-4). Stds unbiased. Returns (N,), detached; 0 for
    a row no source applies to, or when the batch has fewer than two such rows.
    """
    if per_source.dim() != 2 or weights.shape != per_source.shape[:1]:
        raise ValueError(
            f"per_source must be (S, N) and weights (S,), got {tuple(per_source.shape)} and "
            f"{tuple(weights.shape)}"
        )
    if group_size < 2 or per_source.size(1) % group_size != 0:
        raise ValueError(
            f"per_source has {per_source.size(1)} rows, not a multiple of group_size={group_size} (>= 2)"
        )
    with torch.no_grad():
        dtype = torch.promote_types(per_source.dtype, torch.float32)
        grouped = per_source.detach().to(dtype).reshape(per_source.size(0), -1, group_size)  # (S, B, G)
        rows = grouped.flatten(0, 1)  # (S * B, G): one source's rewards of one group per row
        normalised = _group_mean_baseline(rows) / (_nan_std(rows, 1) + _STD_EPS)
        summed = (normalised.reshape_as(per_source) * weights.to(dtype)[:, None]).nansum(0)  # (N,)
        summed = summed.masked_fill(per_source.isnan().all(0), float("nan"))  # no source applies
        advantages = (summed - torch.nanmean(summed)) / (_nan_std(summed).squeeze() + _STD_EPS)
    return advantages.masked_fill(advantages.isnan(), 0.0)  # inf stays: the trainers skip such a batch


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int, normalize: bool = False) -> torch.Tensor:
    """RLOO's advantages, TRL 1.x's form: each reward minus the mean of the other scored rewards of its group.

    rewards: (N,), groups on consecutive rows, NaN = unscored (left out of its siblings' baselines).
    normalize: standardise the defined advantages over the whole batch, (a - mean) / (std + 1e-4), std
    unbiased. Returns (N,), detached; 0 for an unscored row or a group with fewer than two scored rows.
    """
    advantages = group_advantages(rewards, group_size, estimator="rloo", scale_rewards="none")
    if not normalize:
        return advantages
    with torch.no_grad():
        present = ~rewards.detach().reshape(-1, group_size).isnan()
        defined = (present & (present.sum(1, keepdim=True) >= 2)).flatten()
        if int(defined.sum()) < 2:  # no spread to divide by: no signal
            return torch.zeros_like(advantages)
        kept = advantages.masked_fill(~defined, float("nan"))
        scaled = (kept - torch.nanmean(kept)) / (_nan_std(kept).squeeze() + _STD_EPS)
        return torch.where(defined, scaled, 0.0)


def rloo_advantages(rlhf_reward: torch.Tensor, rloo_k: int) -> torch.Tensor:
    """RLOO's advantage: each reward minus the mean reward of the other k-1 completions of its prompt.

    rlhf_reward: (B*k,), the k completions of each prompt on consecutive rows (the layout of every
    trainer that samples a group per prompt). `group_advantages` with the "rloo" estimator, unscaled.
    """
    if rloo_k < 2:
        raise ValueError(f"rloo_k must be >= 2 for a leave-one-out baseline, got {rloo_k}")
    if rlhf_reward.dim() != 1:
        raise ValueError(f"rlhf_reward must be 1-D (B*k,), got shape {tuple(rlhf_reward.shape)}")
    if rlhf_reward.numel() % rloo_k != 0:
        raise ValueError(f"rlhf_reward has {rlhf_reward.numel()} entries, not divisible by rloo_k={rloo_k}")
    return group_advantages(rlhf_reward, rloo_k, estimator="rloo", scale_rewards="none")
