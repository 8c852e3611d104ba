"""GRPO-family policy losses: one surrogate and one normaliser per `loss_type`.

Every loss type is a `PolicyLossSpec` in `POLICY_LOSSES`: a per-token surrogate (PPO's clipped
ratio, CISPO's clipped-and-detached weight, SAPO's soft gate, VESPO's gamma weight), a normaliser that
turns the per-token losses of a micro-batch into its share of the optimizer step's loss, optionally a
forced importance-sampling level, and the loss's own hyperparameters with TRL's defaults. A new variant
is one function (surrogate or normaliser) plus one registry entry.

The normalisers follow TRL 1.16's definitions, written so that the losses of the micro-batches of
one optimizer step add up to the step's loss (`step_tokens`, `step_sequences` count the whole step):
  grpo     sum over sequences of each sequence's token mean / step_sequences (Shao et al. 2024)
  bnpo     token mean of this micro-batch * sequences / step_sequences (TRL: / accumulation steps)
  dapo     token sum / step_tokens (Yu et al. 2025)
  dr_grpo  token sum / (step_sequences * max_completion_length) (Liu et al. 2025)
  gspo     grpo with the sequence-level ratio exp(mean log-ratio) (Zheng et al. 2025)
  cispo    -clip(ratio, max=epsilon_high).detach() * A * logprob, normalised as dapo (MiniMax 2025);
           as in TRL, epsilon_high is the absolute cap on the weight (ScaleRL's eps_max, e.g. 5.0)
  sapo     -f(r) A with the soft gate f(r) = 4 sigmoid(tau (r - 1)) / tau, tau = sapo_temperature_pos
           for A > 0 else _neg (its gradient weight 4 s (1 - s) is 1 at r = 1), normalised as grpo
           (Gao et al. 2025, arXiv:2511.20347)
  vespo    -phi(w) A logprob, phi(w) = exp(lam + k log w - lam w) detached, w = exp(sum of the token
           log-ratios) of the sequence, (k, lam) = vespo_k/lambda_pos for A >= 0 else _neg; normalised
           as dapo (arXiv:2602.10693). As in TRL: log-ratios clamped to [-20, 20], log w to [log 1e-8, 20]
  luspo    the clipped surrogate, each sequence's token sum (at sequence level: its loss times its
           length) / step_sequences (arXiv:2602.05261; meant with importance_sampling_level="sequence")
Where micro-batches are of equal size these equal TRL's values exactly (TRL divides grpo, bnpo and
dr_grpo by the number of accumulation steps; dapo by the step's tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class Surrogate(NamedTuple):
    """Per-token loss before normalisation and the importance weights behind it."""

    per_token_loss: torch.Tensor  # (N, T), or (N, 1) at sequence level
    ratio: torch.Tensor  # importance weights, detached, same shape
    clipped_low: torch.Tensor  # bool, same shape: where the lower clip removed the gradient
    clipped_high: torch.Tensor  # bool: where the upper clip (or CISPO's cap) acted


@dataclass(frozen=True)
class LossInputs:
    """Everything a surrogate or normaliser may read. Shapes: (N, T) except advantages (N, 1)."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor  # float, 1 = a token in the loss
    epsilon_low: float
    epsilon_high: float
    delta: float | None
    importance_sampling_level: str
    max_completion_length: int | None
    step_tokens: float
    step_sequences: float
    options: dict[str, float]  # the loss type's own hyperparameters (`PolicyLossSpec.options`)
    sampler_weights: torch.Tensor | None = None  # (N, T) `core.sampler_correction` weights, or None


@dataclass
class PolicyLossResult:
    """`loss` carries the gradient; the rest are detached scalars for logging.

    clip_ratio_*: fraction of loss tokens (of sequences, at sequence level) whose ratio was clipped
    so that the gradient vanished: low = ratio < 1 - epsilon_low with A < 0, high = ratio >
    1 + epsilon_high with A > 0 (CISPO: ratio > epsilon_high with A > 0, the weight is capped),
    region = either. Ratios are taken before `delta`'s clamp. `kl_mean` is None without a KL term.
    """

    loss: torch.Tensor
    clip_ratio_low: torch.Tensor
    clip_ratio_high: torch.Tensor
    clip_ratio_region: torch.Tensor
    ratio_mean: torch.Tensor
    kl_mean: torch.Tensor | None = None


def _log_importance_weights(x: LossInputs) -> torch.Tensor:
    """(N, T) token log-ratios, or (N, 1) their masked mean per sequence (GSPO's length-normalised ratio)."""
    log_ratio = x.logprobs - x.old_logprobs
    if x.importance_sampling_level == "token":
        return log_ratio
    return ((log_ratio * x.loss_mask).sum(-1) / x.loss_mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def clipped_surrogate(x: LossInputs) -> Surrogate:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), with r clamped above by `delta` if set (INTELLECT-2)."""
    ratio = torch.exp(_log_importance_weights(x))
    clipped = torch.clamp(ratio, 1 - x.epsilon_low, 1 + x.epsilon_high)
    unclipped = ratio if x.delta is None else torch.clamp(ratio, max=x.delta)
    per_token_loss = -torch.min(unclipped * x.advantages, clipped * x.advantages)
    ratio = ratio.detach()
    low = (ratio < 1 - x.epsilon_low) & (x.advantages < 0)
    high = (ratio > 1 + x.epsilon_high) & (x.advantages > 0)
    return Surrogate(per_token_loss, ratio, low, high)


def cispo_surrogate(x: LossInputs) -> Surrogate:
    """-sg(min(r, epsilon_high)) * A * logprob: every token keeps a gradient, only its weight is capped."""
    ratio = torch.exp(_log_importance_weights(x)).detach()
    per_token_loss = -torch.clamp(ratio, max=x.epsilon_high) * x.advantages * x.logprobs
    high = (ratio > x.epsilon_high) & (x.advantages > 0)
    return Surrogate(per_token_loss, ratio, torch.zeros_like(high), high)


def sapo_surrogate(x: LossInputs) -> Surrogate:
    """-4 sigmoid(tau (r - 1)) / tau * A: a smooth gate instead of the clip, tau by the advantage's sign."""
    ratio = torch.exp(_log_importance_weights(x))
    positive = x.advantages > 0
    tau = torch.where(positive, x.options["sapo_temperature_pos"], x.options["sapo_temperature_neg"])
    per_token_loss = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * x.advantages
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return Surrogate(per_token_loss, ratio.detach(), no_clip, no_clip)


_LOG_W_MIN = math.log(1e-8)


def vespo_weights(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi, w), both (N, 1) and detached: VESPO's gamma weight of each sequence's ratio w."""
    log_ratio = (x.logprobs - x.old_logprobs).detach().clamp(-20.0, 20.0)
    log_w = (log_ratio * x.loss_mask).sum(-1, keepdim=True)
    if x.sampler_weights is not None:  # w = pi / pi_sampler: the sampler correction joins the ratio (as TRL)
        log_is = torch.log(x.sampler_weights.detach()).clamp(_LOG_W_MIN, 20.0)
        log_w = log_w + (log_is * x.loss_mask).sum(-1, keepdim=True)
    log_w = log_w.clamp(_LOG_W_MIN, 20.0)
    positive = x.advantages >= 0
    k = torch.where(positive, x.options["vespo_k_pos"], x.options["vespo_k_neg"])
    lam = torch.where(positive, x.options["vespo_lambda_pos"], x.options["vespo_lambda_neg"]).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))  # phi(1) = 1
    return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0), torch.exp(log_w)


def vespo_surrogate(x: LossInputs) -> Surrogate:
    """-phi(w) * A * logprob: every token keeps a gradient, scaled by its sequence's gamma weight."""
    phi, w = vespo_weights(x)
    per_token_loss = -phi * x.advantages * x.logprobs
    no_clip = torch.zeros_like(w, dtype=torch.bool)
    return Surrogate(per_token_loss, w, no_clip, no_clip)


def mean_of_sequence_means(masked_loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """grpo: each sequence's token mean, summed and divided by the step's sequences."""
    sequence_means = masked_loss.sum(-1) / x.loss_mask.sum(-1).clamp(min=1.0)
    return sequence_means.sum() / x.step_sequences


def local_token_mean(masked_loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """bnpo: this micro-batch's token mean, weighted by its share of the step's sequences."""
    token_mean = masked_loss.sum() / x.loss_mask.sum().clamp(min=1.0)
    return token_mean * (masked_loss.size(0) / x.step_sequences)


def step_token_mean(masked_loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """dapo, cispo: token sum over the loss tokens of the whole step."""
    return masked_loss.sum() / x.step_tokens


def sequence_sum_mean(masked_loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """luspo: each sequence's token sum, summed and divided by the step's sequences."""
    return masked_loss.sum() / x.step_sequences


def constant_length_mean(masked_loss: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """dr_grpo: token sum over a constant, step sequences * max_completion_length."""
    return masked_loss.sum() / (x.step_sequences * x.max_completion_length)


@dataclass(frozen=True)
class PolicyLossSpec:
    surrogate: Callable[[LossInputs], Surrogate]
    normaliser: Callable[[torch.Tensor, LossInputs], torch.Tensor]
    importance_sampling_level: str | None = None  # None: the caller's choice
    options: dict[str, float] = field(default_factory=dict)  # hyperparameter -> TRL's default


POLICY_LOSSES: dict[str, PolicyLossSpec] = {
    "grpo": PolicyLossSpec(clipped_surrogate, mean_of_sequence_means),
    "bnpo": PolicyLossSpec(clipped_surrogate, local_token_mean),
    "dapo": PolicyLossSpec(clipped_surrogate, step_token_mean),
    "dr_grpo": PolicyLossSpec(clipped_surrogate, constant_length_mean),
    "gspo": PolicyLossSpec(clipped_surrogate, mean_of_sequence_means, importance_sampling_level="sequence"),
    "cispo": PolicyLossSpec(cispo_surrogate, step_token_mean),
    "sapo": PolicyLossSpec(
        sapo_surrogate,
        mean_of_sequence_means,
        options={"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05},
    ),
    "vespo": PolicyLossSpec(
        vespo_surrogate,
        step_token_mean,
        options={"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0},
    ),
    "luspo": PolicyLossSpec(clipped_surrogate, sequence_sum_mean),
}


def _check_inputs(loss_type, logprobs, old_logprobs, advantages, loss_mask, extra) -> None:
    if loss_type not in POLICY_LOSSES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(POLICY_LOSSES)}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (N, T), got shape {tuple(logprobs.shape)}")
    per_token = {k: v for k, v in extra.items() if k != "sequence_mask"}
    for name, tensor in {"old_logprobs": old_logprobs, "loss_mask": loss_mask, **per_token}.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal logprobs {tuple(logprobs.shape)}"
            )
    for name, tensor in {"advantages": advantages, "sequence_mask": extra.get("sequence_mask")}.items():
        if tensor is not None and tensor.shape != logprobs.shape[:1]:
            raise ValueError(f"{name} must be (N,) = ({logprobs.size(0)},), got shape {tuple(tensor.shape)}")


def _check_spec_inputs(loss_type, spec, max_completion_length, loss_options) -> None:
    """What a loss type needs: dr_grpo a max_completion_length; loss_options only of its own names."""
    if spec.normaliser is constant_length_mean and not max_completion_length:
        raise ValueError(f"loss_type={loss_type!r} needs max_completion_length (its constant normaliser)")
    unknown = set(loss_options or {}) - set(spec.options)
    if unknown:
        raise ValueError(
            f"loss_type={loss_type!r} has no option {', '.join(sorted(unknown))}; "
            f"its options: {', '.join(spec.options) or 'none'}"
        )


def _masked_stat(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over loss tokens, or over sequences for (N, 1) sequence-level values."""
    values = values.detach().float()
    if values.size(-1) == 1 and mask.size(-1) != 1:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _policy_term(
    per_token_loss: torch.Tensor,
    spec: PolicyLossSpec,
    x: LossInputs,
    entropy_mask: torch.Tensor | None,
    sequence_mask: torch.Tensor | None,
) -> torch.Tensor:
    """The surrogate's per-token loss without the tokens / sequences the masks leave out, times the sampler
    weights (vespo has them in its sequence ratio already)."""
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask.to(per_token_loss.dtype)
    if sequence_mask is not None:
        per_token_loss = per_token_loss * sequence_mask.to(per_token_loss.dtype).unsqueeze(-1)
    if x.sampler_weights is not None and spec.surrogate is not vespo_surrogate:
        per_token_loss = per_token_loss * x.sampler_weights
    return per_token_loss


def policy_loss(
    loss_type: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    per_token_kl: torch.Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    step_tokens: float | None = None,
    step_sequences: float | None = None,
    entropy_mask: torch.Tensor | None = None,
    sequence_mask: torch.Tensor | None = None,
    loss_options: dict[str, float] | None = None,
    sampler_weights: torch.Tensor | None = None,
) -> PolicyLossResult:
    """This micro-batch's share of a GRPO-family loss (see the module docstring per loss_type).

    logprobs (with gradient), old_logprobs, loss_mask: (N, T); advantages: (N,). per_token_kl: (N, T),
    added as beta * per_token_kl when beta > 0 (build it with `core.kl.per_token_kl`). entropy_mask:
    (N, T) bool from `entropy_mask`, drops low-entropy tokens from the policy term only (not from the
    normaliser nor the KL term, as TRL). sequence_mask: (N,) bool, likewise drops whole sequences from
    the policy term (`core.off_policy.off_policy_sequence_mask`). sampler_weights: (N, T) from
    `core.sampler_correction`, multiply the policy term only (vespo: its sequence ratio, as TRL).
    step_tokens / step_sequences: loss tokens / sequences of the whole optimizer step (default: this
    micro-batch's). epsilon_high None -> epsilon_low. loss_options: the loss type's own hyperparameters
    (`POLICY_LOSSES[loss_type].options`; missing ones take TRL's defaults, unknown ones are an error).
    """
    _check_inputs(
        loss_type,
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        dict(per_token_kl=per_token_kl, entropy_mask=entropy_mask, sequence_mask=sequence_mask,
             sampler_weights=sampler_weights),
    )  # fmt: skip
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}"
        )
    if beta > 0 and per_token_kl is None:
        raise ValueError(f"beta={beta} > 0 needs per_token_kl (N, T)")
    spec = POLICY_LOSSES[loss_type]
    _check_spec_inputs(loss_type, spec, max_completion_length, loss_options)
    mask = loss_mask.to(logprobs.dtype)
    x = LossInputs(
        logprobs=logprobs,
        old_logprobs=old_logprobs.detach(),
        advantages=advantages.detach().to(logprobs.dtype).unsqueeze(-1),
        loss_mask=mask,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_low if epsilon_high is None else epsilon_high,
        delta=delta,
        importance_sampling_level=spec.importance_sampling_level or importance_sampling_level,
        max_completion_length=max_completion_length,
        step_tokens=float(step_tokens) if step_tokens is not None else max(float(mask.sum()), 1.0),
        step_sequences=float(step_sequences) if step_sequences is not None else float(logprobs.size(0)),
        options={**spec.options, **(loss_options or {})},
        sampler_weights=None if sampler_weights is None else sampler_weights.detach().to(logprobs.dtype),
    )
    surrogate = spec.surrogate(x)
    per_token_loss = _policy_term(surrogate.per_token_loss, spec, x, entropy_mask, sequence_mask)
    if beta > 0:
        per_token_loss = per_token_loss + beta * per_token_kl
    loss = spec.normaliser(per_token_loss * mask, x)
    region = surrogate.clipped_low | surrogate.clipped_high
    return PolicyLossResult(
        loss=loss,
        clip_ratio_low=_masked_stat(surrogate.clipped_low, mask),
        clip_ratio_high=_masked_stat(surrogate.clipped_high, mask),
        clip_ratio_region=_masked_stat(region, mask),
        ratio_mean=_masked_stat(surrogate.ratio, mask),
        kl_mean=None if per_token_kl is None else _masked_stat(per_token_kl, mask),
    )
