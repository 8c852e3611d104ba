"""Sentiment judge (VADER) and preference-pair labelling for the "positive review" task.

VADER is a small rule-based sentiment model: no weights to download, fast on CPU, deterministic.
Its compound score lies in [-1, 1], which makes it a ready-made sequence-level reward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

logger = logging.getLogger(__name__)

RewardFn = Callable[[list[str]], list[float]]


class SentimentJudge:
    """Scores texts by VADER's compound sentiment in [-1, 1]; a reward callable for RLOO/PPO.

    Example: `SentimentJudge()(["What a wonderful film."])` gives one positive float. As a pairwise judge
    (`rlhfkit.judges`): `RuleJudge.of_texts(SentimentJudge())`, or `load_judge("positive-review")`.
    """

    def __init__(self) -> None:
        try:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
        except ImportError as err:
            raise ImportError(
                "SentimentJudge needs the vaderSentiment package; install it with "
                "`pip install rlhfkit[demo]` (or `pip install vaderSentiment`)."
            ) from err
        self._analyzer = SentimentIntensityAnalyzer()

    def __call__(self, texts: Sequence[str]) -> list[float]:
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, got a single str; wrap it in a list")
        return [float(self._analyzer.polarity_scores(text)["compound"]) for text in texts]


def label_preference_pairs(
    prompts: Sequence[str],
    completions_a: Sequence[str],
    completions_b: Sequence[str],
    judge: RewardFn,
) -> Dataset:
    """Judge two completions per prompt and keep the preferred one as "chosen".

    Returns a `datasets.Dataset` with "prompt", "chosen" and "rejected" columns (the reward/DPO
    format). Pairs the judge scores equally carry no preference and are dropped; the count is logged
    and stored in `dataset.info.description`.
    """
    if not len(prompts) == len(completions_a) == len(completions_b):
        raise ValueError(
            "prompts, completions_a and completions_b must have the same length, got "
            f"{len(prompts)}, {len(completions_a)} and {len(completions_b)}"
        )
    from datasets import Dataset, DatasetInfo

    scores_a, scores_b = list(judge(list(completions_a))), list(judge(list(completions_b)))
    if len(scores_a) != len(completions_a) or len(scores_b) != len(completions_b):
        raise ValueError("judge must return one score per completion")
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    ties = 0
    for prompt, a, b, score_a, score_b in zip(prompts, completions_a, completions_b, scores_a, scores_b):
        if score_a == score_b:
            ties += 1
            continue
        chosen, rejected = (a, b) if score_a > score_b else (b, a)
        rows["prompt"].append(prompt)
        rows["chosen"].append(chosen)
        rows["rejected"].append(rejected)
    logger.info("label_preference_pairs: kept %d pairs, dropped %d ties", len(rows["prompt"]), ties)
    info = DatasetInfo(description=f"preference pairs labelled by a judge; {ties} ties dropped")
    return Dataset.from_dict(rows, info=info)
