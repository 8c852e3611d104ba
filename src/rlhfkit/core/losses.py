"""Losses: PPO clipped policy/value (Schulman et al. 2017), DPO variants, Bradley-Terry reward loss.

PPO losses average over real tokens of the whole batch (a masked mean), not per sequence first.
The value loss is 0.5 * max(unclipped, clipped) squared error as in the OpenAI lm-human-preferences
code. DPO variants: TRL's menu of `loss_type` values (`DPO_LOSSES`), each a function of
`PreferenceTerms`; "sigmoid" is DPO (Rafailov et al. 2023) with the label smoothing of conservative DPO;
"ipo" and "sigmoid_norm" divide the summed log-ratios by the completion lengths, as TRL does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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


@dataclass(frozen=True)
class PreferenceTerms:
    """What a DPO-family loss reads, per pair (B,): the sequence log-probs, their log-ratios to the reference,
    the f-divergence scores of those ratios (`f_divergence_scores`), completion lengths and the options."""

    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    ref_chosen_logps: torch.Tensor
    ref_rejected_logps: torch.Tensor
    chosen_scores: torch.Tensor
    rejected_scores: torch.Tensor
    chosen_lengths: torch.Tensor | None
    rejected_lengths: torch.Tensor | None
    beta: float
    label_smoothing: float
    discopop_tau: float

    @property
    def chosen_logratios(self) -> torch.Tensor:
        return self.chosen_logps - self.ref_chosen_logps

    @property
    def rejected_logratios(self) -> torch.Tensor:
        return self.rejected_logps - self.ref_rejected_logps

    @property
    def margin(self) -> torch.Tensor:
        """beta * (chosen score - rejected score): the logit of DPO's Bradley-Terry preference."""
        return self.beta * (self.chosen_scores - self.rejected_scores)

    def per_token(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen and rejected scores divided by their completion lengths (IPO, sigmoid_norm); without
        lengths, the scores as given (TRL 0.x passed IPO log-probs already averaged per token)."""
        if self.chosen_lengths is None or self.rejected_lengths is None:
            return self.chosen_scores, self.rejected_scores
        return (
            self.chosen_scores / self.chosen_lengths.clamp(min=1),
            self.rejected_scores / self.rejected_lengths.clamp(min=1),
        )


def _smoothed_logistic(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """-log sigmoid(logits), with probability label_smoothing that the preference is flipped (cDPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def _sorted_margin(t: PreferenceTerms, chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """AOT: the batch's chosen and rejected quantities each sorted, then paired by rank."""
    return t.beta * (torch.sort(chosen, dim=0).values - torch.sort(rejected, dim=0).values)


def _ipo(t: PreferenceTerms) -> torch.Tensor:
    # IPO (Azar et al. 2023) regresses the per-token log-ratio gap onto 1 / (2 * tau), tau = beta
    chosen, rejected = t.per_token()
    return (chosen - rejected - 1 / (2 * t.beta)).square()


def _exo_pair(t: PreferenceTerms) -> torch.Tensor:
    # EXO (Ji et al. 2024): KL(softmax of the two beta-scaled ratios || (1 - eps, eps)); eps 1e-3 when unset
    eps = t.label_smoothing or 1e-3
    q_chosen, q_rejected = torch.sigmoid(t.margin), torch.sigmoid(-t.margin)
    return q_chosen * (F.logsigmoid(t.margin) - math.log1p(-eps)) + q_rejected * (
        F.logsigmoid(-t.margin) - math.log(eps)
    )


def _robust(t: PreferenceTerms) -> torch.Tensor:
    # rDPO (Chowdhury et al. 2024): unbiased under labels flipped with probability eps
    eps = t.label_smoothing
    return (-(1 - eps) * F.logsigmoid(t.margin) + eps * F.logsigmoid(-t.margin)) / (1 - 2 * eps)


def _sppo_hard(t: PreferenceTerms) -> torch.Tensor:
    # SPPO (Wu et al. 2024) with hard win probabilities: 1 for the chosen, 0 for the rejected
    return (t.chosen_logratios - 0.5 / t.beta).square() + (t.rejected_logratios + 0.5 / t.beta).square()


def _discopop(t: PreferenceTerms) -> torch.Tensor:
    # DiscoPOP (Chan Lu et al. 2024): logistic and exponential losses mixed by sigmoid(margin / tau)
    mix = torch.sigmoid(t.margin / t.discopop_tau)
    return -F.logsigmoid(t.margin) * (1 - mix) + torch.exp(-t.margin) * mix


def _sft(t: PreferenceTerms) -> torch.Tensor:
    # negative log-likelihood of the chosen completions per token, over the whole batch, on every pair
    # (without lengths, the log-probs are taken as per-token averages already)
    tokens = (
        t.chosen_logps.new_tensor(len(t.chosen_logps)) if t.chosen_lengths is None else t.chosen_lengths.sum()
    )
    return (-t.chosen_logps.sum() / tokens.clamp(min=1)).expand_as(t.chosen_logps)


def _sigmoid_norm(t: PreferenceTerms) -> torch.Tensor:
    chosen, rejected = t.per_token()
    return -F.logsigmoid(t.beta * (chosen - rejected))


# name -> fn(terms) -> per-pair losses (B,); TRL's loss_type names
DPO_LOSSES: dict[str, Callable[[PreferenceTerms], torch.Tensor]] = {
    "sigmoid": lambda t: _smoothed_logistic(t.margin, t.label_smoothing),  # DPO (Rafailov et al. 2023)
    "hinge": lambda t: torch.relu(1 - t.margin),  # SLiC (Zhao et al. 2023)
    "ipo": _ipo,
    "exo_pair": _exo_pair,
    "nca_pair": lambda t: (  # NCA (Chen et al. 2024)
        -F.logsigmoid(t.beta * t.chosen_logratios)
        - 0.5 * F.logsigmoid(-t.beta * t.chosen_logratios)
        - 0.5 * F.logsigmoid(-t.beta * t.rejected_logratios)
    ),
    "robust": _robust,
    "bco_pair": lambda t: (  # BCO on pairs (Jung et al. 2024)
        -F.logsigmoid(t.beta * t.chosen_logratios) - F.logsigmoid(-t.beta * t.rejected_logratios)
    ),
    "sppo_hard": _sppo_hard,
    "aot": lambda t: _smoothed_logistic(  # AOT (Melnyk et al. 2024), paired
        _sorted_margin(t, t.chosen_logps - t.rejected_logps, t.ref_chosen_logps - t.ref_rejected_logps),
        t.label_smoothing,
    ),
    "aot_unpaired": lambda t: _smoothed_logistic(
        _sorted_margin(t, t.chosen_logratios, t.rejected_logratios), t.label_smoothing
    ),
    "apo_zero": lambda t: (  # APO (D'Oosterlinck et al. 2024): chosen better than the model's own outputs
        1 - torch.sigmoid(t.beta * t.chosen_logratios) + torch.sigmoid(t.beta * t.rejected_logratios)
    ),
    "apo_down": lambda t: (  # ... and worse than them
        torch.sigmoid(t.beta * t.chosen_logratios)
        + 1
        - torch.sigmoid(t.beta * (t.chosen_logratios - t.rejected_logratios))
    ),
    "discopop": _discopop,
    "sft": _sft,
    "sigmoid_norm": _sigmoid_norm,
}

F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")


def f_divergence_scores(
    logratios: torch.Tensor, kind: str = "reverse_kl", alpha: float = 1.0
) -> torch.Tensor:
    """f'(pi / pi_ref) from log(pi / pi_ref) (Wang et al. 2023, f-DPO): reverse KL is the log-ratio itself;
    forward KL 1 - 1/t; Jensen-Shannon log 2t/(t+1); alpha divergence (t^(alpha-1) - 1) / (alpha - 1)."""
    if kind == "reverse_kl" or (kind == "alpha_divergence" and abs(alpha - 1.0) < 1e-6):
        return logratios
    if kind == "forward_kl":
        return 1 - torch.exp(-logratios)
    if kind == "js_divergence":
        return math.log(2) + F.logsigmoid(logratios)
    if kind == "alpha_divergence":  # the exponent clamped so exp stays finite in float32
        return torch.expm1(((alpha - 1.0) * logratios.float()).clamp(max=80.0)).to(logratios.dtype) / (
            alpha - 1.0
        )
    raise ValueError(f"unknown f_divergence_type {kind!r}; valid: {', '.join(F_DIVERGENCES)}")


def loss_type_list(loss_type: str | Sequence[str]) -> list[str]:
    """`loss_type` as a list: TRL 0.x names one loss, TRL 1.x a list of them."""
    return [loss_type] if isinstance(loss_type, str) else list(loss_type)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str | Sequence[str] = "sigmoid",
    label_smoothing: float = 0.0,
    reference_free: bool = False,
    *,
    loss_weights: Sequence[float] | None = None,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float = 1.0,
    discopop_tau: float = 0.05,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO-family losses from summed sequence log-probs.

    All inputs (B,). `loss_type`: a key of DPO_LOSSES, or a list of them summed with `loss_weights` (default
    all 1). The scores compared are f'(pi / pi_ref) of `f_divergence_type` (reverse KL: the log-ratios, plain
    DPO). "ipo", "sigmoid_norm" and "sft" average over `chosen_lengths` / `rejected_lengths` (completion
    tokens); without them the log-probs are taken as per-token averages already. `reference_free`: a
    uniform reference (log-probs 0).
    Returns (losses (B,), chosen_rewards (B,), rejected_rewards (B,)); the implicit rewards are
    beta * (policy - reference) log-probs, detached.
    """
    names = loss_type_list(loss_type)
    unknown = [n for n in names if n not in DPO_LOSSES]
    if unknown or not names:
        raise ValueError(f"unknown DPO loss_type {unknown or names!r}; valid: {', '.join(DPO_LOSSES)}")
    weights = [1.0] * len(names) if loss_weights is None else list(loss_weights)
    if len(weights) != len(names):
        raise ValueError(
            f"loss_weights has {len(weights)} entries for {len(names)} loss types; give one each"
        )
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
    terms = PreferenceTerms(
        policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps,
        f_divergence_scores(chosen_logratios, f_divergence_type, f_alpha_divergence_coef),
        f_divergence_scores(rejected_logratios, f_divergence_type, f_alpha_divergence_coef),
        chosen_lengths, rejected_lengths, beta, label_smoothing, discopop_tau,
    )  # fmt: skip
    losses = sum(weight * DPO_LOSSES[name](terms) for name, weight in zip(names, weights))
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
