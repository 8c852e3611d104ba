"""Statistics, tracker logs and the model card for `PPOTrainer`.

Every statistic of a step is a tensor until `stats_to_python` turns it into floats (scalars) and
numpy arrays (distributions), so `gather_stats` can reduce them across processes first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from rlhfkit.core.masking import masked_mean, masked_var

# per-minibatch statistics that are distributions (1-D, one value per real token), not scalars:
# concatenated across minibatches and logged whole, as TRL logs them
DISTRIBUTION_STATS = frozenset({"policy/ratio"})


@contextlib.contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
    """Record the seconds the body took as `timing["time/ppo/<name>"]`."""
    start = time.perf_counter()
    yield
    timing[f"time/ppo/{name}"] = time.perf_counter() - start


def _masked_values(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.detach()[mask.bool()].float()


def summarize_step(
    *,
    kl_coef: float,
    scores: torch.Tensor,
    queries: Sequence[torch.Tensor],
    responses: Sequence[torch.Tensor],
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    advantages: torch.Tensor,
    non_score_rewards: torch.Tensor,
    kls: torch.Tensor,
    mask: torch.Tensor,
    train_stats: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The documented step statistics (objective/*, ppo/*, tokens/*) as tensors.

    Sequence-level quantities (KL, entropy, non-score reward) are sums over real response tokens,
    averaged over the batch; `train_stats` hold one value per minibatch and are averaged.
    """
    mask = mask.bool()
    fmask = mask.float()
    kl_per_sequence = (kls * fmask).sum(-1)
    query_lens = torch.tensor([len(q) for q in queries], dtype=torch.float32)
    response_lens = torch.tensor([len(r) for r in responses], dtype=torch.float32)
    returns_var = masked_var(returns, mask, unbiased=False)
    residual_var = masked_var(returns - values, mask, unbiased=False)
    stats = {
        "objective/kl": kl_per_sequence.mean(),
        "objective/kl_dist": kl_per_sequence,
        "objective/logprobs": _masked_values(logprobs, mask),
        "objective/ref_logprobs": _masked_values(ref_logprobs, mask),
        "objective/kl_coef": torch.tensor(float(kl_coef)),
        "objective/entropy": (-logprobs * fmask).sum(-1).mean(),
        "ppo/mean_non_score_reward": (non_score_rewards * fmask).sum(-1).mean(),
        "ppo/mean_scores": scores.float().mean(),
        "ppo/std_scores": scores.float().std() if scores.numel() > 1 else torch.tensor(0.0),
        "ppo/policy/advantages": _masked_values(advantages, mask),
        "ppo/val/var_explained": 1 - residual_var / returns_var.clamp(min=1e-8),
        "tokens/queries_len_mean": query_lens.mean(),
        "tokens/queries_len_std": query_lens.std() if len(queries) > 1 else torch.tensor(0.0),
        "tokens/queries_dist": query_lens,
        "tokens/responses_len_mean": response_lens.mean(),
        "tokens/responses_len_std": response_lens.std() if len(responses) > 1 else torch.tensor(0.0),
        "tokens/responses_dist": response_lens,
    }
    for key, value in train_stats.items():
        stats[f"ppo/{key}"] = value.float() if key in DISTRIBUTION_STATS else value.float().mean()
    return stats


def minibatch_loss_stats(
    *,
    pg_loss: torch.Tensor,
    vf_loss: torch.Tensor,
    vf_coef: float,
    policy: Any,
    value: Any,
    entropy: torch.Tensor | None,
    vpreds: torch.Tensor,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Detached per-minibatch statistics of the PPO loss (keys without the 'ppo/' prefix).

    `vf_loss` is the unweighted value loss; the total is pg_loss + vf_coef * vf_loss. `policy/ratio`
    holds the probability ratio exp(logprobs - old_logprobs) of every real token.
    """
    with torch.no_grad():
        stats = {
            "loss/policy": pg_loss.detach(),
            "loss/value": vf_loss.detach(),
            "loss/total": (pg_loss + vf_coef * vf_loss).detach(),
            "policy/approxkl": policy.approxkl,
            "policy/policykl": masked_mean(old_logprobs - logprobs.detach(), mask),
            "policy/clipfrac": policy.clipfrac,
            "policy/advantages_mean": masked_mean(advantages, mask),
            "policy/ratio_mean": policy.ratio_mean,
            "policy/ratio_var": policy.ratio_var,
            "policy/ratio": _masked_values(torch.exp(logprobs.detach().float() - old_logprobs.float()), mask),
            "returns/mean": masked_mean(returns, mask),
            "returns/var": masked_var(returns, mask, unbiased=False),
            "val/vpred": masked_mean(vpreds.detach(), mask),
            "val/error": value.vpred_error,
            "val/clipfrac": value.clipfrac,
            "val/mean": masked_mean(vpreds.detach(), mask),
            "val/var": masked_var(vpreds.detach(), mask, unbiased=False),
        }
        if entropy is not None:
            stats["policy/entropy"] = masked_mean(entropy.detach(), mask)
    return stats


def stack_stats(per_minibatch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """[{key: scalar}] -> {key: (n,) tensor}; keys missing from some minibatches are skipped there.

    Distributions (`DISTRIBUTION_STATS`) are concatenated instead.
    """
    keys = {k for stats in per_minibatch for k in stats}
    stacked = {}
    for k in sorted(keys):
        values = [s[k].float() for s in per_minibatch if k in s]
        stacked[k] = (
            torch.cat([v.reshape(-1) for v in values])
            if k in DISTRIBUTION_STATS
            else torch.stack([v.reshape(()) for v in values])
        )
    return stacked


def stats_to_python(stats: dict[str, Any]) -> dict[str, Any]:
    """Scalar tensors -> float, other tensors -> numpy arrays; anything else passes through."""
    out = {}
    for key, value in stats.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().float().cpu()
            out[key] = value.item() if value.dim() == 0 else value.numpy()
        else:
            out[key] = value
    return out


def tracker_scalars(stats: dict[str, Any]) -> dict[str, float]:
    """The scalar entries of a stats dict (trackers like TensorBoard take numbers only)."""
    scalars = {}
    for key, value in stats.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        elif isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool):
            scalars[key] = float(value)
    return scalars


def flat_hparams(config_dict: dict[str, Any]) -> dict[str, Any]:
    """Config values a tracker can store as hyperparameters (numbers, strings, bools); dicts flattened."""
    flat: dict[str, Any] = {}
    for key, value in config_dict.items():
        if isinstance(value, dict):
            for sub, inner in flat_hparams(value).items():
                flat[f"{key}/{sub}"] = inner
        elif isinstance(value, bool | int | float | str):
            flat[key] = value
    return flat


def gather_across_processes(accelerator: Any, stats: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Scalar tensors are averaged over processes; 1-D distributions are concatenated (any lengths)."""
    gathered = {}
    for key, value in stats.items():
        if not isinstance(value, torch.Tensor):
            gathered[key] = value
            continue
        value = value.to(device).float()
        if value.dim() == 0:
            gathered[key] = accelerator.reduce(value, "mean")
        else:
            padded = accelerator.pad_across_processes(value.reshape(-1), dim=0, pad_index=float("nan"))
            everything = accelerator.gather(padded)
            gathered[key] = everything[~torch.isnan(everything)]
    return gathered


def as_score_tensor(rewards: Any) -> torch.Tensor:
    """A list of scalar tensors / floats, or a tensor, -> (B,) float32."""
    if isinstance(rewards, torch.Tensor):
        return rewards.detach().reshape(-1).float()
    return torch.stack([torch.as_tensor(r, dtype=torch.float32).reshape(()) for r in rewards])


def reward_summary(rewards: torch.Tensor) -> dict[str, Any]:
    """env/reward_mean, env/reward_std and env/reward_dist of a (B,) tensor."""
    return {
        "env/reward_mean": rewards.mean().item(),
        "env/reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "env/reward_dist": rewards.cpu().numpy(),
    }


def wandb_table(batch: dict[str, Any], rewards: torch.Tensor, columns: list[str]) -> Any:
    """A wandb.Table of the batch's text columns and rewards; None if a column is missing."""
    if not columns or not all(c in batch for c in columns):
        return None
    import wandb

    rows = [[*(str(batch[c][i]) for c in columns), float(rewards[i])] for i in range(len(batch[columns[0]]))]
    return wandb.Table(columns=[*columns, "reward"], rows=rows)


MODEL_CARD = """---
library_name: rlhfkit
tags:
- rlhfkit
- ppo
- reinforcement-learning
---

# {model_name}

This model was fine-tuned with proximal policy optimisation (PPO) by the `PPOTrainer` of
rlhfkit: completions were sampled from the model, scored,
and the model was updated with a KL penalty towards its starting point.

- task: {task_name}
- base model: {base_model}
- steps: {steps}

## Usage

```python
from rlhfkit import AutoModelForCausalLMWithValueHead

model = AutoModelForCausalLMWithValueHead.from_pretrained("{path}")
```
"""


class SkippedStepStats(dict):
    """What `PPOTrainer.step` returns for a skipped (non-finite) step: any statistic not set reads NaN,
    so a training loop that prints `stats["ppo/mean_scores"]` keeps working."""

    def __missing__(self, key: str) -> float:
        return float("nan")
