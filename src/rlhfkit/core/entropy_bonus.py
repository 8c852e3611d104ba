"""The entropy bonus of GRPO-style losses and Skywork-OR1's adaptive coefficient (He et al. 2025, §3.2).

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
