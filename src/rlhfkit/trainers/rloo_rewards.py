"""Scores for RLOO completions, from reward models and/or reward functions, and the RLHF reward.

A source is either a sequence-classification model (read at the last real token) or a callable
`completions -> scores`. Several sources are combined as a weighted sum. A reward model whose
tokenizer differs from the policy's gets the decoded text re-encoded with its own tokenizer.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from rlhfkit.core import clip_tensor, compute_token_rewards, kl_penalty, masked_whiten
from rlhfkit.rollout import reward_model_scores
from rlhfkit.trainers.guards import NonFiniteStepWarning


def source_name(source: Any) -> str:
    if isinstance(source, nn.Module):
        return f"reward model {type(source).__name__}"
    name = getattr(source, "__name__", None) or type(source).__name__
    return f"reward function {name!r}"


def _accepts_prompts(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "prompts" or p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


class RewardScorer:
    """Weighted sum of reward sources; `__call__` returns (scores (N,), per-source scores (S, N))."""

    def __init__(
        self,
        reward_model: Any,
        tokenizer: Any,
        reward_processing_class: Any = None,
        reward_weights: Sequence[float] | None = None,
        device: torch.device | str = "cpu",
    ):
        self.sources = list(reward_model) if isinstance(reward_model, (list, tuple)) else [reward_model]
        if not self.sources:
            raise ValueError("reward_model: give at least one reward model or reward function")
        for source in self.sources:
            if not (isinstance(source, nn.Module) or callable(source)):
                raise TypeError(
                    f"reward_model must be an nn.Module (sequence classification, one output) or a callable "
                    f"list[str] -> list[float], got {type(source).__name__}"
                )
        self.weights = (
            [1.0] * len(self.sources) if reward_weights is None else [float(w) for w in reward_weights]
        )
        if len(self.weights) != len(self.sources):
            raise ValueError(
                f"reward_weights has {len(self.weights)} entries for {len(self.sources)} reward sources; "
                "give one weight per reward model / function"
            )
        tokenizers = reward_processing_class
        if not isinstance(tokenizers, (list, tuple)):
            tokenizers = [tokenizers] * len(self.sources)
        if len(tokenizers) != len(self.sources):
            raise ValueError(
                f"reward_processing_class: got {len(tokenizers)} tokenizers for {len(self.sources)} sources"
            )
        # None or the policy's own tokenizer: score the token ids directly, no decode / re-encode round trip
        self.tokenizers = [None if tok is None or tok is tokenizer else tok for tok in tokenizers]
        for tok in self.tokenizers:
            if tok is not None and tok.pad_token is None:
                raise ValueError(
                    "reward_processing_class has no pad token; set tokenizer.pad_token (e.g. to eos)"
                )
        self.tokenizer, self.device = tokenizer, device
        for source in self.sources:
            if isinstance(source, nn.Module):
                source.to(device).eval().requires_grad_(False)

    @property
    def needs_text(self) -> bool:
        return any(
            not isinstance(s, nn.Module) or t is not None for s, t in zip(self.sources, self.tokenizers)
        )

    def __call__(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        prompts: list[str] | None = None,
        completions: list[str] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = responses.shape[0]
        per_source = torch.empty(len(self.sources), n, device=responses.device)
        for i, (source, reward_tokenizer) in enumerate(zip(self.sources, self.tokenizers)):
            if not isinstance(source, nn.Module):
                values = self._call_function(source, completions, prompts, n)
            elif reward_tokenizer is None:
                ids = torch.cat([query_ids, responses], dim=1)
                mask = torch.cat([query_mask.long(), response_mask.long()], dim=1)
                values = reward_model_scores(source, ids, mask)
            else:
                values = self._score_retokenized(source, reward_tokenizer, prompts, completions)
            if not torch.isfinite(values).all():  # the trainer's NonFiniteGuard then skips the update
                message = f"{source_name(source)} returned non-finite scores: {values.tolist()}"
                warnings.warn(message, NonFiniteStepWarning, stacklevel=2)
            per_source[i] = values.to(per_source)
        weights = torch.tensor(self.weights, device=per_source.device)
        return (weights[:, None] * per_source).sum(0), per_source

    def _call_function(
        self, fn: Callable, completions: list[str], prompts: list[str], n: int
    ) -> torch.Tensor:
        result = fn(completions, prompts=prompts) if _accepts_prompts(fn) else fn(completions)
        if isinstance(result, torch.Tensor):
            result = result.detach().reshape(-1).tolist()
        try:
            values = [float(v) for v in result]
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{source_name(fn)} must return a list of numbers, got {type(result).__name__}"
            ) from err
        if len(values) != n:
            raise ValueError(
                f"{source_name(fn)} returned {len(values)} scores for {n} completions; expected one each"
            )
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def _score_retokenized(
        self, model: nn.Module, tokenizer: Any, prompts: list[str], completions: list[str]
    ):
        texts = [p + c for p, c in zip(prompts, completions)]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return reward_model_scores(
            model, batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        )


def normalize_scores(scores: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Reinforce++ `normalize_reward`: standardise the raw scores (N,) of a batch, then clip to ±clip_range.

    Applied to the scores before the KL term is added, so the KL penalty keeps its kl_coef scale.
    """
    return clip_tensor(masked_whiten(scores, None), clip_range)


def sequence_level_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One KL penalty per completion: score - kl_coef * sum_t kl_t.

    Returns (rlhf_reward (N,), non_score_reward (N,), kl (N, T) zero on padding).
    """
    kl = torch.where(response_mask.bool(), kl_penalty(logprobs, ref_logprobs, "kl"), 0.0)
    non_score_reward = -kl_coef * kl.sum(1)
    return scores + non_score_reward, non_score_reward, kl


def token_level_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reinforce++ eq. (1): -kl_coef * kl_t per token plus the score on the last real token, summed."""
    rewards, non_score_rewards, kl = compute_token_rewards(
        scores, logprobs, ref_logprobs, response_mask, kl_coef
    )
    return rewards.sum(1), non_score_rewards.sum(1), kl


# config.token_level_kl -> how the KL penalty enters the reward
RLHF_REWARDS: dict[bool, Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
    False: sequence_level_rlhf_reward,
    True: token_level_rlhf_reward,
}


def compute_rlhf_reward(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    token_level_kl: bool = False,
    normalize_clip_range: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RLOO's reward per completion: score - kl_coef * KL, the score first normalised when asked.

    `normalize_clip_range` set (Reinforce++ `normalize_reward`) standardises and clips the raw scores (N,)
    before the KL term is added. Returns (rlhf_reward (N,), non_score_reward (N,), kl (N, T)).
    """
    if normalize_clip_range is not None:
        scores = normalize_scores(scores, normalize_clip_range)
    return RLHF_REWARDS[token_level_kl](scores, logprobs, ref_logprobs, response_mask, kl_coef)
