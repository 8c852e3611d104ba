"""Per-token KL estimators and KL-coefficient controllers.

Estimators of KL(pi || pi_ref) at the sampled token (Schulman, "Approximating KL divergence"):
"kl" is k1 = logp - ref (unbiased, can be negative), "mse" is k2 = 0.5 (logp - ref)^2, "k3" is
exp(ref - logp) - (ref - logp) - 1 (unbiased, non-negative, low variance), "abs" is |logp - ref|
and "full" is the exact KL summed over the vocabulary from both logit tensors; "k1" and "k2" are
aliases of "kl" and "mse". `per_token_kl` adds the importance-weighted ("unbiased") form of
DeepSeek-V3.2: k * pi/pi_sampling, whose gradient is that of the reverse KL on samples drawn from
an older policy (TRL's `use_bias_correction_kl`).
The adaptive controller is the proportional controller of Ziegler et al. (2019).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlhfkit.core.logprobs import full_kl_from_logits


def _kl_k1(logprobs, ref_logprobs, logits, ref_logits):
    return logprobs - ref_logprobs


def _kl_abs(logprobs, ref_logprobs, logits, ref_logits):
    return (logprobs - ref_logprobs).abs()


def _kl_mse(logprobs, ref_logprobs, logits, ref_logits):
    return 0.5 * (logprobs - ref_logprobs).square()


def _kl_k3(logprobs, ref_logprobs, logits, ref_logits):
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio  # exp(x) - x - 1, accurate near x = 0


def _kl_full(logprobs, ref_logprobs, logits, ref_logits):
    if logits is None or ref_logits is None:
        raise ValueError('kl_penalty kind="full" needs both logits and ref_logits (B, T, V)')
    return full_kl_from_logits(logits, ref_logits)


# name -> fn(logprobs, ref_logprobs, logits, ref_logits) -> (B, T)
KL_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {
    "kl": _kl_k1,
    "abs": _kl_abs,
    "mse": _kl_mse,
    "full": _kl_full,
    "k3": _kl_k3,
}

# Schulman's names for the same estimators
KL_ALIASES = {"k1": "kl", "k2": "mse"}


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str = "kl",
    logits: torch.Tensor | None = None,
    ref_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate.

    logprobs, ref_logprobs: (B, T) log-probs of the sampled tokens; logits, ref_logits: (B, T, V),
    needed only for kind="full" (pass them already divided by the sampling temperature).
    Returns (B, T).
    """
    estimator = KL_ESTIMATORS.get(KL_ALIASES.get(kind, kind))
    if estimator is None:
        valid = ", ".join([*KL_ESTIMATORS, *KL_ALIASES])
        raise ValueError(f"unknown KL kind {kind!r}; valid kinds: {valid}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs shape {tuple(ref_logprobs.shape)} must equal logprobs {tuple(logprobs.shape)}"
        )
    return estimator(logprobs, ref_logprobs, logits, ref_logits)


def per_token_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k3",
    sampling_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) for a policy loss, optionally importance-corrected.

    logprobs (with gradient), ref_logprobs, sampling_logprobs: (B, T). With sampling_logprobs (the
    policy that generated the tokens), the estimate is multiplied by exp(logprobs - sampling_logprobs),
    which keeps its gradient: even on-policy, where the factor is 1, it changes the gradient.
    Returns (B, T).
    """
    kl = kl_penalty(logprobs, ref_logprobs, estimator)
    if sampling_logprobs is None:
        return kl
    if sampling_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"sampling_logprobs shape {tuple(sampling_logprobs.shape)} must equal logprobs "
            f"{tuple(logprobs.shape)}"
        )
    return kl * torch.exp(logprobs - sampling_logprobs.detach())


MAX_ERROR = 0.2  # the adaptive controller's clip on its proportional error


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, section 2.2).

    error = clip(current_kl / target - 1, -0.2, 0.2); value *= 1 + error * n_steps / horizon.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if target <= 0:
            raise ValueError(f"target KL must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -MAX_ERROR), MAX_ERROR)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def max_rise(self, n_steps: int) -> float:
        """The largest relative rise of the coefficient in one update of `n_steps` samples."""
        return MAX_ERROR * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))


class FixedKLController:
    """Constant KL coefficient; `update` is a no-op so trainers can treat both kinds alike."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
