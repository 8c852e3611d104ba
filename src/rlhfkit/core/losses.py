"""Losses: PPO clipped policy/value (Schulman et al. 2017), DPO variants, Bradley-Terry reward loss.

PPO losses average over real tokens of the whole batch (a masked mean), not per sequence first.
The value loss is 0.5 * max(unclipped, clipped) squared error as in the OpenAI lm-human-preferences
code. DPO variants: "sigmoid" (Rafailov et al. 2023, with the label smoothing of conservative
DPO), "hinge" (SLiC, Zhao et al. 2023) and "ipo" (Azar et al. 2023); the log-probs given are
sequence sums, so IPO here uses the summed (not length-averaged) log-ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlhfkit.core.masking import masked_mean, masked_var


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    clipfrac: torch.Tensor
    approxkl: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_var: torch.Tensor


@dataclass
class ValueLossOutput:
    loss: torch.Tensor
    clipfrac: torch.Tensor
    vpred_error: torch.Tensor


def _mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return values.mean() if mask is None else masked_mean(values, mask)


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
    cliprange: float,
    cliprange_high: float | None = None,
) -> PolicyLossOutput:
    """Clipped surrogate objective, as a loss to minimise.

    logprobs, old_logprobs, advantages, mask: (B, T) (or (B,) for sequence-level actions, as in
    RLOO; mask=None averages over everything). The ratio is clipped to [1 - cliprange, 1 + cliprange_high]
    (cliprange_high defaults to cliprange). Statistics in the output are detached scalars;
    approxkl = 0.5 * mean((logprobs - old_logprobs)^2).
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != advantages.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and advantages "
            f"{tuple(advantages.shape)} must have the same shape"
        )
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    high = cliprange if cliprange_high is None else cliprange_high
    clipped = -advantages * ratio.clamp(1.0 - cliprange, 1.0 + high)
    loss = _mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        real = torch.ones_like(ratio, dtype=torch.bool) if mask is None else mask
        return PolicyLossOutput(
            loss=loss,
            clipfrac=_mean((clipped > unclipped).float(), mask),
            approxkl=0.5 * _mean(log_ratio.square(), mask),
            ratio_mean=_mean(ratio, mask),
            ratio_var=masked_var(ratio, real, unbiased=False),
        )


def ppo_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None,
    cliprange_value: float,
) -> ValueLossOutput:
    """Clipped value loss 0.5 * max((v - R)^2, (v_clipped - R)^2), masked mean.

    vpreds, old_values, returns, mask: (B, T); v_clipped = old + clamp(v - old, -c, c).
    clipfrac and vpred_error (masked mean of (v - R)^2) are detached.
    """
    if vpreds.shape != old_values.shape or vpreds.shape != returns.shape:
        raise ValueError(
            f"vpreds {tuple(vpreds.shape)}, old_values {tuple(old_values.shape)} and returns "
            f"{tuple(returns.shape)} must have the same shape"
        )
    vclipped = old_values + (vpreds - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped = (vpreds - returns).square()
    clipped = (vclipped - returns).square()
    loss = 0.5 * _mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        return ValueLossOutput(
            loss=loss,
            clipfrac=_mean((clipped > unclipped).float(), mask),
            vpred_error=_mean(unclipped, mask),
        )


def _dpo_sigmoid(logits: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # with probability label_smoothing the preference label is assumed flipped (conservative DPO)
    return -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(
        -beta * logits
    )


def _dpo_hinge(logits: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    return torch.relu(1 - beta * logits)


def _dpo_ipo(logits: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # IPO regresses the log-ratio gap onto 1 / (2 * tau), with tau = beta
    return (logits - 1 / (2 * beta)).square()


# name -> fn(logits, beta, label_smoothing) -> per-pair losses
DPO_LOSSES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {
    "sigmoid": _dpo_sigmoid,
    "hinge": _dpo_hinge,
    "ipo": _dpo_ipo,
}


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reference_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO-family losses from summed sequence log-probs.

    All inputs (B,). logits = (pc - pr) - (rc - rr), or pc - pr when reference_free.
    Returns (losses (B,), chosen_rewards (B,), rejected_rewards (B,)); the implicit rewards are
    beta * (policy - reference) log-probs, detached.
    """
    loss_fn = DPO_LOSSES.get(loss_type)
    if loss_fn is None:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {', '.join(DPO_LOSSES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    shape = policy_chosen_logps.shape
    for name, t in (
        ("policy_rejected_logps", policy_rejected_logps),
        ("reference_chosen_logps", reference_chosen_logps),
        ("reference_rejected_logps", reference_rejected_logps),
    ):
        if t.shape != shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} must equal policy_chosen_logps {tuple(shape)}")
    if reference_free:
        reference_chosen_logps = torch.zeros_like(reference_chosen_logps)
        reference_rejected_logps = torch.zeros_like(reference_rejected_logps)
    chosen_logratios = policy_chosen_logps - reference_chosen_logps
    rejected_logratios = policy_rejected_logps - reference_rejected_logps
    losses = loss_fn(chosen_logratios - rejected_logratios, beta, label_smoothing)
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def pairwise_reward_loss(
    rewards_chosen: torch.Tensor,
    rewards_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """Bradley-Terry loss -mean(logsigmoid(rc - rr - margin)), plus coef * mean((rc + rr)^2).

    rewards_chosen, rewards_rejected, margin: (B,) (a trailing dim of 1 is accepted) -> scalar.
    The centring term (Eisenstein et al. 2023) keeps rewards near zero mean.
    """
    if rewards_chosen.shape != rewards_rejected.shape:
        raise ValueError(
            f"rewards_rejected shape {tuple(rewards_rejected.shape)} must equal rewards_chosen "
            f"{tuple(rewards_chosen.shape)}"
        )
    rewards_chosen, rewards_rejected = rewards_chosen.reshape(-1), rewards_rejected.reshape(-1)
    gap = rewards_chosen - rewards_rejected
    if margin is not None:
        gap = gap - margin.reshape(-1).to(gap.dtype)
    loss = -F.logsigmoid(gap).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (rewards_chosen + rewards_rejected).square().mean()
    return loss
