"""Judges that score each completion alone and compare the scores: a reward model or a rule function.

Both score through `rollout.rewards.RewardScorer`, the one scoring path of the trainers, so a judge reads a
reward model exactly as PPO/RLOO do. Scoring each completion alone makes these judges blind to the order
of a pair. Scores equal within `margin` (or not finite) are a tie.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from rlhfkit.judges.base import TIE, BasePairwiseJudge, BaseRankJudge, check_pairs
from rlhfkit.rewards.scoring import RewardScorer

ScoreFn = Callable[[list[str], list[str]], Sequence[float]]


class ScoreJudge(BasePairwiseJudge):
    """A pairwise judge over a `RewardScorer`: the completion with the higher score wins."""

    def __init__(self, scorer: RewardScorer, margin: float = 0.0):
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, got {margin!r}")
        self.scorer, self.margin = scorer, float(margin)

    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """One score per (prompt, completion)."""
        return self.scorer.score_texts(prompts, completions)[0].tolist()

    def judge(
        self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True
    ) -> list[int]:
        check_pairs(prompts, completions)
        flat_prompts = [p for p in prompts for _ in range(2)]
        scores = self.scores(flat_prompts, [c for pair in completions for c in pair])
        return [self._compare(scores[2 * i], scores[2 * i + 1]) for i in range(len(prompts))]

    def _compare(self, first: float, second: float) -> int:
        if not (math.isfinite(first) and math.isfinite(second)) or abs(first - second) <= self.margin:
            return TIE
        return 0 if first > second else 1


class RewardModelJudge(ScoreJudge):
    """Judges by a sequence-classification reward model (one output) read at the last real token.

    `tokenizer` encodes prompt + completion for the model: its own tokenizer, or the policy's when the
    reward model was trained on top of the policy's vocabulary.
    """

    def __init__(self, reward_model: nn.Module, tokenizer: Any, margin: float = 0.0, device: Any = None):
        if not isinstance(reward_model, nn.Module):
            raise TypeError(f"reward_model must be an nn.Module, got {type(reward_model).__name__}")
        if tokenizer is None:
            raise ValueError("tokenizer is required: the reward model reads prompt + completion text")
        if tokenizer.pad_token is None:
            raise ValueError("tokenizer has no pad token; set tokenizer.pad_token (e.g. to eos)")
        if device is None:
            device = next(reward_model.parameters()).device
        super().__init__(RewardScorer(reward_model, tokenizer, device=device), margin)


class RuleJudge(ScoreJudge):
    """Judges by a rule or lexicon function `fn(prompts, completions) -> scores` (one float per completion).

    Example: `RuleJudge(lambda prompts, completions: [c.count("!") for c in completions])`. A scorer of
    completions alone, such as `rlhfkit.tasks.SentimentJudge`, is wrapped with `RuleJudge.of_texts`.
    """

    def __init__(self, fn: ScoreFn, margin: float = 0.0):
        if not callable(fn):
            raise TypeError(
                f"fn must be callable as fn(prompts, completions) -> scores, got {type(fn).__name__}"
            )

        def score(completions: list[str], prompts: list[str]) -> Sequence[float]:
            return fn(prompts, completions)

        score.__name__ = getattr(fn, "__name__", type(fn).__name__)
        super().__init__(RewardScorer(score, tokenizer=None), margin)

    @classmethod
    def of_texts(cls, fn: Callable[[list[str]], Sequence[float]], margin: float = 0.0) -> RuleJudge:
        """A rule judge over a scorer that reads completions only (`fn(completions) -> scores`)."""

        def by_text(prompts: list[str], completions: list[str]) -> Sequence[float]:
            return fn(completions)

        by_text.__name__ = getattr(fn, "__name__", type(fn).__name__)
        return cls(by_text, margin)


class ScoreRankJudge(BaseRankJudge):
    """Ranks any number of completions per prompt by a `ScoreJudge`'s scores, best first.

    Equal scores keep their input order in the ranking (a ranking has no place for a tie); ask the
    pairwise judge when ties matter.
    """

    def __init__(self, judge: ScoreJudge):
        if not isinstance(judge, ScoreJudge):
            raise TypeError(
                f"judge must be a ScoreJudge (RewardModelJudge, RuleJudge), got {type(judge).__name__}"
            )
        self.scorer_judge = judge

    def judge(
        self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True
    ) -> list[list[int]]:
        if len(prompts) != len(completions):
            raise ValueError(
                f"got {len(prompts)} prompts for {len(completions)} completion lists; expected one each"
            )
        flat_prompts = [p for p, group in zip(prompts, completions) for _ in group]
        scores = self.scorer_judge.scores(flat_prompts, [c for group in completions for c in group])
        ranks, start = [], 0
        for group in completions:
            own = scores[start : start + len(group)]
            # best first; a non-finite score ranks last
            ranks.append(
                sorted(range(len(group)), key=lambda i: -own[i] if math.isfinite(own[i]) else math.inf)
            )
            start += len(group)
        return ranks
