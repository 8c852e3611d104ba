"""DDPO maths: a stochastic DDIM step that also returns the log-probability of its sample.

DDPO (Black et al. 2023) treats each denoising step x_t -> x_{t-1} as an action of a Gaussian
policy. With DDIM (Song et al. 2021, eq. 12 and 16) and noise level eta > 0 that policy is

    x0_hat = (x_t - sqrt(1 - a_t) * eps) / sqrt(a_t)              (a = cumulative alpha product)
    sigma^2 = eta^2 * (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    mu      = sqrt(a_prev) * x0_hat + sqrt(1 - a_prev - sigma^2) * eps
    x_{t-1} ~ N(mu, sigma^2 I)

and its log-probability is the Gaussian log-density averaged over every non-batch dimension (a
per-element mean, as in the DDPO paper's code: the exact log-density divided by the latent size, which
keeps importance ratios on the scale that `train_clip_range=1e-4` was tuned for). A per-prompt reward
normaliser is here too; the clipped surrogate is PPO's (`core.losses.ppo_policy_loss`). Everything
needs only torch; a scheduler is read duck-typed (`alphas_cumprod`, `final_alpha_cumprod`,
`num_inference_steps`, `config`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.core.masking import masked_whiten


@dataclass
class DDIMStepOutput:
    prev_sample: torch.Tensor  # (B, C, H, W) the next (less noisy) latent
    logprobs: torch.Tensor  # (B,) float32 log N(prev_sample; mean, std^2), mean over latent elements
    mean: torch.Tensor  # (B, C, H, W)
    std: torch.Tensor  # broadcastable to mean


def _per_sample(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """Reshape a scalar or (B,) tensor so it broadcasts against a (B, ...) tensor of rank `ndim`."""
    return x.reshape(x.shape + (1,) * (ndim - x.ndim)) if x.ndim else x


def ddim_posterior(
    model_output: torch.Tensor,
    sample: torch.Tensor,
    alpha_prod_t: torch.Tensor,
    alpha_prod_t_prev: torch.Tensor,
    eta: float,
    prediction_type: str = "epsilon",
    clip_sample_range: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of the DDIM transition x_t -> x_{t-1}.

    model_output, sample: (B, ...). alpha_prod_t, alpha_prod_t_prev: scalars or (B,).
    Returns (mean (B, ...), std broadcastable to mean). `clip_sample_range` clamps x0_hat.
    """
    a_t = _per_sample(alpha_prod_t.to(sample.device, torch.float32), sample.ndim)
    a_prev = _per_sample(alpha_prod_t_prev.to(sample.device, torch.float32), sample.ndim)
    x_t, out = sample.float(), model_output.float()
    if prediction_type == "epsilon":
        x0 = (x_t - (1 - a_t).sqrt() * out) / a_t.sqrt()
        eps = out
    elif prediction_type == "v_prediction":
        x0 = a_t.sqrt() * x_t - (1 - a_t).sqrt() * out
        eps = a_t.sqrt() * out + (1 - a_t).sqrt() * x_t
    elif prediction_type == "sample":
        x0 = out
        eps = (x_t - a_t.sqrt() * x0) / (1 - a_t).sqrt()
    else:
        raise ValueError(
            f"prediction_type must be 'epsilon', 'v_prediction' or 'sample', got {prediction_type!r}"
        )
    if clip_sample_range is not None:
        x0 = x0.clamp(-clip_sample_range, clip_sample_range)
    variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
    std = eta * variance.clamp(min=0).sqrt()
    mean = a_prev.sqrt() * x0 + (1 - a_prev - std**2).clamp(min=0).sqrt() * eps
    return mean, std


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) averaged over every dimension but the first. Returns (B,) float32."""
    x, mean, std = x.float(), mean.float(), std.float().expand_as(mean)
    logp = -((x - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)
    return logp.flatten(1).mean(dim=1)


def ddim_alphas(scheduler: Any, timestep: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a_t, a_prev) for a DDIM scheduler at `timestep` (int, scalar or (B,) tensor)."""
    if not getattr(scheduler, "num_inference_steps", None):
        raise ValueError("call scheduler.set_timesteps(num_inference_steps) before stepping")
    alphas = scheduler.alphas_cumprod
    t = torch.as_tensor(timestep, device=alphas.device).long()
    prev_t = t - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    final = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=alphas.dtype, device=alphas.device)
    a_prev = torch.where(prev_t >= 0, alphas[prev_t.clamp(min=0)], final)
    return alphas[t], a_prev


def ddim_step_with_logprob(
    scheduler: Any,
    model_output: torch.Tensor,
    timestep: torch.Tensor | int,
    sample: torch.Tensor,
    eta: float = 1.0,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DDIMStepOutput:
    """One stochastic DDIM step and the log-probability of its result.

    model_output, sample: (B, C, H, W); timestep: int or (B,). With `prev_sample` given, nothing is
    sampled: the function scores that latent (how training re-evaluates stored trajectories).
    Raises when the step has zero noise (eta <= 0, or `set_alpha_to_one=True` at the last step),
    because a deterministic step has no density.
    """
    if eta <= 0:
        raise ValueError(f"eta must be > 0 for a stochastic DDIM step with a log-probability, got {eta}")
    cfg = scheduler.config
    a_t, a_prev = ddim_alphas(scheduler, timestep)
    clip = cfg.clip_sample_range if getattr(cfg, "clip_sample", False) else None
    mean, std = ddim_posterior(model_output, sample, a_t, a_prev, eta, cfg.prediction_type, clip)
    if bool((std <= 0).any()):
        raise ValueError(
            "this DDIM step has zero variance (last step of a scheduler with set_alpha_to_one=True?); "
            "DDPO needs every step stochastic: build the scheduler with set_alpha_to_one=False"
        )
    if prev_sample is None:
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        prev_sample = mean + std * noise
    logprobs = gaussian_logprob(prev_sample, mean, std)
    return DDIMStepOutput(prev_sample.to(sample.dtype), logprobs, mean, std)


def classifier_free_guidance(noise_pred: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """Guided prediction from a (2B, ...) batch ordered [unconditional; conditional]. Returns (B, ...)."""
    uncond, cond = noise_pred.chunk(2)
    return uncond + guidance_scale * (cond - uncond)


class PerPromptStatTracker:
    """Normalises each prompt's rewards by that prompt's recent reward history.

    Every prompt keeps its last `buffer_size` rewards. Until it has `min_count` of them (and at least
    two, for an unbiased std) the whole batch is standardised instead (`masked_whiten`), so rare prompts
    do not get noisy baselines.
    """

    def __init__(self, buffer_size: int, min_count: int, eps: float = 1e-6):
        if buffer_size < 1 or min_count < 1:
            raise ValueError(f"buffer_size and min_count must be >= 1, got {buffer_size} and {min_count}")
        self.buffer_size, self.min_count, self.eps = buffer_size, min_count, eps
        self.buffers: dict[str, deque[float]] = {}

    def update(self, prompts: list[str], scores: torch.Tensor) -> torch.Tensor:
        """prompts: B strings; scores: (B,). Returns (B,) float32 advantages."""
        scores = torch.as_tensor(scores, dtype=torch.float32).flatten()
        if len(prompts) != scores.numel():
            raise ValueError(f"got {len(prompts)} prompts but {scores.numel()} scores")
        advantages = torch.empty_like(scores)
        whole_batch = None  # standardised only if some prompt lacks a history (needs >= 2 scores)
        for prompt in dict.fromkeys(prompts):  # unique, in first-seen order
            idx = torch.tensor([i for i, p in enumerate(prompts) if p == prompt])
            buffer = self.buffers.setdefault(prompt, deque(maxlen=self.buffer_size))
            buffer.extend(scores[idx].tolist())
            if len(buffer) < max(self.min_count, 2):
                whole_batch = masked_whiten(scores, None) if whole_batch is None else whole_batch
                advantages[idx] = whole_batch[idx]
                continue
            history = torch.tensor(list(buffer))
            advantages[idx] = (scores[idx] - history.mean()) / (history.std() + self.eps)
        return advantages

    def get_stats(self) -> dict[str, dict[str, float]]:
        """Per prompt: mean, sample std (0 with a single reward) and count of the buffered rewards."""
        return {
            p: {
                "mean": float(torch.tensor(list(b)).mean()),
                "std": float(torch.tensor(list(b)).std()) if len(b) > 1 else 0.0,
                "count": len(b),
            }
            for p, b in self.buffers.items()
        }

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": {p: list(b) for p, b in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = {p: deque(v, maxlen=self.buffer_size) for p, v in state["buffers"].items()}
