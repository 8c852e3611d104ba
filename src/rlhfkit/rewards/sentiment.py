"""The sentiment reward (VADER) of the "positive review" task.

VADER is a small rule-based sentiment model: no weights to download, fast on CPU, deterministic.
Its compound score lies in [-1, 1], which makes it a ready-made sequence-level reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhfkit.rewards.rules import completion_text


class SentimentJudge:
    """Scores texts by VADER's compound sentiment in [-1, 1]; a reward callable for RLOO/PPO.

    A conversation is scored on its final assistant message (`completion_text`).
    Example: `SentimentJudge()(["What a wonderful film."])` gives one positive float. As a pairwise judge
    (`rlhfkit.judges`): `RuleJudge.of_texts(SentimentJudge())`, or `load_judge("positive-review")`.
    """

    def __init__(self) -> None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError as err:
            raise ImportError(
                "SentimentJudge needs the vaderSentiment package; install it with "
                "`pip install 'rlhfkit[demo]'` (or `pip install vaderSentiment`)."
            ) from err
        self._analyzer = SentimentIntensityAnalyzer()

    def __call__(self, completions: Sequence[str], **columns: Any) -> list[float]:
        if isinstance(completions, str):
            raise TypeError("completions must be a list of strings, got a single str; wrap it in a list")
        texts = [completion_text(c) for c in completions]
        return [float(self._analyzer.polarity_scores(text)["compound"]) for text in texts]
