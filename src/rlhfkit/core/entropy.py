"""Entropy in GRPO-style losses: the high-entropy token mask (Wang et al. 2025, "80/20"), the entropy bonus
and Skywork-OR1's adaptive coefficient (He et al. 2025, §3.2).

The loss becomes L_policy - c * H, with H the mean per-token entropy of the trained tokens: a bonus that
keeps the policy from collapsing to near-deterministic outputs. With adaptive control c moves by a fixed
step each optimizer step, up while the measured entropy is at or below the target and down above it, kept
in [c_min, c_max]; and the bonus only acts while the entropy is at or below the target (a policy already
exploring enough is left alone). As in TRL 1.16, the entropy measured at one step sets the coefficient
(and whether it applies) of the next one.
"""

from __future__ import annotations

import math

import torch

from rlhfkit.core.masking import masked_mean


def entropy_bonus(entropies: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """-coef * mean entropy over `mask`: the term added to the loss (gradient flows through `entropies`).

    entropies, mask: (N, T). An empty mask gives 0, not NaN.
    """
    if not mask.any():
        return entropies.sum() * 0.0
    return -coef * masked_mean(entropies, mask)


def adapt_entropy_coef(
    coef: float, entropy: float, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """The next coefficient: coef + delta (at most coef_max) when entropy <= target, else coef - delta (at
    least coef_min). A NaN entropy (nothing measured) leaves coef unchanged."""
    if math.isnan(entropy):
        return coef
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


def applied_entropy_coef(coef: float, last_entropy: float, target: float, adaptive: bool) -> float:
    """The coefficient the loss uses now: `coef`, or with adaptive control 0 while the last measured entropy
    is above `target` (inf before the first measurement: no bonus until one exists)."""
    if adaptive and not last_entropy <= target:
        return 0.0
    return coef


def entropy_mask(
    entropies: torch.Tensor, loss_mask: torch.Tensor, quantile: float, pooled: torch.Tensor | None = None
) -> torch.Tensor:
    """Keep the loss tokens whose entropy is in the top `quantile` (Wang et al. 2025, "80/20").

    entropies, loss_mask: (N, T). quantile in [0, 1]: 1.0 keeps every loss token, 0.2 the 20% most
    uncertain ones; the threshold is the (1 - quantile) quantile of the loss tokens' entropies
    (linear interpolation), and ties with it are kept. pooled: (M,) the entropies that set the threshold
    when they are not just these loss tokens' (e.g. the loss tokens of every process). Returns (N, T) bool,
    False off the mask; all False when there is nothing to take a quantile of.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    if entropies.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} must equal entropies {tuple(entropies.shape)}"
        )
    mask = loss_mask.bool()
    values = entropies.detach().float()[mask] if pooled is None else pooled.detach().float().reshape(-1)
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropies.detach().float() >= threshold) & mask
