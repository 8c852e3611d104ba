"""The reward maths: per-token KL-shaped rewards, RLOO's per-completion reward, score scaling.

reward_t = -beta * KL_t on every real response token, plus the sequence score on the last real
token (Ziegler et al. 2019; Stiennon et al. 2020). Score scaling keeps running moments that can be
merged across processes with the parallel-variance formula of Chan et al. (1979), so every rank
can normalise with the statistics of the global batch.

RLOO's reward is one number per completion: the score minus the KL penalty, taken per completion or,
Reinforce++ style, per token and then summed over the completion (`compute_rlhf_reward`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from rlhfkit.core.kl import kl_penalty as _kl_penalty
from rlhfkit.core.masking import last_true_indices, masked_whiten


def compute_token_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty: str = "kl",
    logits: torch.Tensor | None = None,
    ref_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL-shaped per-token rewards.

    scores: (B,); logprobs, ref_logprobs, response_mask: (B, T); logits/ref_logits (B, T, V) only
    for kl_penalty="full". Returns (rewards, non_score_rewards, kl), each (B, T) and 0 on padding:
    kl is the per-token estimate, non_score_rewards = -kl_coef * kl, and rewards adds each score at
    the last real token of its row (a row with no real token gets no score).
    """
    if scores.shape != logprobs.shape[:1]:
        raise ValueError(f"scores must be (batch,) = {tuple(logprobs.shape[:1])}, got {tuple(scores.shape)}")
    if response_mask.shape != logprobs.shape:
        raise ValueError(
            f"response_mask shape {tuple(response_mask.shape)} must equal logprobs {tuple(logprobs.shape)}"
        )
    if logprobs.dim() != 2 or logprobs.shape[1] == 0:
        raise ValueError(f"logprobs must be (batch, length) with length >= 1, got {tuple(logprobs.shape)}")
    real = response_mask.bool()
    kl = _kl_penalty(logprobs, ref_logprobs, kl_penalty, logits, ref_logits)
    kl = torch.where(real, kl, 0.0)
    non_score_rewards = -kl_coef * kl
    last = last_true_indices(real)
    has_token = last >= 0
    score_at_end = torch.where(has_token, scores.to(kl.dtype), 0.0)
    rewards = non_score_rewards.scatter_add(1, last.clamp(min=0)[:, None], score_at_end[:, None])
    return rewards, non_score_rewards, kl


def apply_missing_eos_penalty(scores: torch.Tensor, has_eos: torch.Tensor, penalty: float) -> torch.Tensor:
    """Subtract `penalty` from the score of each sequence that never emitted EOS.

    scores: (B,), has_eos: (B,) bool -> (B,) new tensor.
    """
    if scores.shape != has_eos.shape:
        raise ValueError(f"has_eos shape {tuple(has_eos.shape)} must equal scores {tuple(scores.shape)}")
    return scores - penalty * (~has_eos.bool()).to(scores.dtype)


def clip_tensor(x: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Clamp to [-clip_range, clip_range] (Reinforce++ reward clipping)."""
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    return x.clamp(-clip_range, clip_range)


def batch_moments(x: torch.Tensor) -> tuple[float, float, int]:
    """(mean, population variance, count) of all entries: the per-rank stats to all-gather."""
    x = x.detach().double()
    if x.numel() == 0:
        return 0.0, 0.0, 0
    return x.mean().item(), x.var(unbiased=False).item(), x.numel()


def combine_moments(stats: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """Merge (mean, population variance, count) triples, e.g. one per rank (Chan et al.)."""
    mean, var, count = 0.0, 0.0, 0
    for other_mean, other_var, other_count in stats:
        total = count + other_count
        if other_count == 0:
            continue
        delta = other_mean - mean
        m2 = var * count + other_var * other_count + delta * delta * count * other_count / total
        mean = mean + delta * other_count / total
        var, count = m2 / total, total
    return mean, var, count


class RunningMoments:
    """Running mean / std of scores over all batches seen, mergeable across processes.

    Before any update, mean = 0 and std = 1 (normalising is then a no-op).
    """

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 0

    @property
    def std(self) -> float:
        """Unbiased standard deviation of everything seen (1.0 before any update)."""
        if self.count < 2:
            return self.var**0.5
        return (self.var * self.count / (self.count - 1)) ** 0.5

    def update_from_moments(self, mean: float, var: float, count: int) -> None:
        """Fold in a batch summarised as (mean, population variance, count)."""
        if count == 0:
            return
        if self.count == 0:
            self.mean, self.var, self.count = float(mean), float(var), int(count)
            return
        self.mean, self.var, self.count = combine_moments(
            [(self.mean, self.var, self.count), (mean, var, count)]
        )

    def update(self, x: torch.Tensor) -> tuple[float, float]:
        """Fold in the values of `x` (any shape); returns this batch's (mean, unbiased std)."""
        mean, var, count = batch_moments(x)
        self.update_from_moments(mean, var, count)
        batch_std = (var * count / (count - 1)) ** 0.5 if count > 1 else 0.0
        return mean, batch_std

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), int(state["count"])


def scale_scores(
    scores: torch.Tensor, moments: RunningMoments, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise scores with running moments: (s - mean) / std, or s / std if not shift_mean."""
    centred = scores - moments.mean if shift_mean else scores
    return centred / (moments.std + eps)


def normalize_scores(scores: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Reinforce++ `normalize_reward`: standardise the raw scores (N,) of a batch, then clip to ±clip_range.

    Applied to the scores before the KL term is added, so the KL penalty keeps its kl_coef scale.
    """
    return clip_tensor(masked_whiten(scores, None), clip_range)


class RLHFReward(NamedTuple):
    """RLOO's reward of each of N completions, with its parts."""

    reward: torch.Tensor  # (N,) score - kl_coef * KL: what the leave-one-out baseline acts on
    non_score_reward: torch.Tensor  # (N,) the KL part alone
    kl: torch.Tensor  # (N, T) per-token KL estimate, zero on padding


def compute_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    token_level_kl: bool = False,
    normalize_clip_range: float | None = None,
) -> RLHFReward:
    """RLOO's reward per completion: score - kl_coef * KL, the score first normalised when asked.

    The KL penalty is taken once per completion (kl_coef * sum_t kl_t), or with `token_level_kl` as
    Reinforce++'s eq. (1) per-token rewards (-kl_coef * kl_t, plus the score on the last real token)
    summed over the completion: equal up to float rounding, the sums taken in another order.
    `normalize_clip_range` set (Reinforce++ `normalize_reward`) standardises and clips the raw scores
    (N,) before the KL term is added.
    """
    if normalize_clip_range is not None:
        scores = normalize_scores(scores, normalize_clip_range)
    if token_level_kl:
        rewards, non_score_rewards, kl = compute_token_rewards(
            scores, logprobs, ref_logprobs, response_mask, kl_coef
        )
        return RLHFReward(rewards.sum(1), non_score_rewards.sum(1), kl)
    kl = torch.where(response_mask.bool(), _kl_penalty(logprobs, ref_logprobs, "kl"), 0.0)
    non_score_reward = -kl_coef * kl.sum(1)
    return RLHFReward(scores + non_score_reward, non_score_reward, kl)
