"""What a judge is: TRL's judge interfaces, kept under their names and call forms.

A pairwise judge returns, per prompt, the index (0 or 1) of the better of two completions, or -1 for a tie
(the judge could not tell them apart). A rank judge returns, per prompt, the completion indices from best
to worst. rlhfkit never breaks a tie at random: callers see it and decide (`win_rate` counts it as half).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

TIE = -1


class BaseJudge(ABC):
    """The root of every judge: one `judge(prompts, completions, shuffle_order=True)` method."""

    @abstractmethod
    def judge(self, prompts: list[str], completions: list, shuffle_order: bool = True) -> list:
        raise NotImplementedError


class BasePairwiseJudge(BaseJudge):
    """Picks the better of two completions per prompt.

    `completions[i]` is the pair `[first, second]` for `prompts[i]`; the result holds 0 (first better),
    1 (second better) or -1 (tie). `shuffle_order` is TRL's switch against position bias; the judges
    shipped here do not depend on the order (they score each completion alone, or judge both orders).
    """

    @abstractmethod
    def judge(
        self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True
    ) -> list[int]:
        raise NotImplementedError


class BaseRankJudge(ABC):
    """Orders any number of completions per prompt: `result[i]` lists `completions[i]`'s indices, best
    first."""

    @abstractmethod
    def judge(
        self, prompts: list[str], completions: list[list[str]], shuffle_order: bool = True
    ) -> list[list[int]]:
        raise NotImplementedError


def check_pairs(prompts: Sequence[str], completions: Sequence[Sequence[str]]) -> None:
    """Raise a clear error unless there is one pair of completions per prompt."""
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single str; wrap it in a list")
    if len(prompts) != len(completions):
        raise ValueError(
            f"got {len(prompts)} prompts for {len(completions)} completion pairs; expected one each"
        )
    for i, pair in enumerate(completions):
        if isinstance(pair, str) or len(pair) != 2:
            raise ValueError(f"completions[{i}] must be a pair [first, second] of completions, got {pair!r}")
