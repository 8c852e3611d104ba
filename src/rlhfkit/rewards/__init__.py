"""Reward functions, and the one scorer that turns any reward source into numbers.

- `rules`: rule ("verifiable") rewards, standard library only: exact-match accuracy, regex format,
  length penalties, and the toy keyword/length/token-count rewards of the learning tests;
- `sentiment`: the VADER sentiment reward of the "positive review" task (`SentimentJudge`);
- `scoring`: `RewardScorer`, which scores completions with reward functions, reward models and reward
  adapters, weighted and summed, for every trainer, command and the demo (imports torch: import it as
  `from rlhfkit.rewards.scoring import RewardScorer`).

Every reward function has TRL's signature `fn(completions, **columns) -> list[float | None]`:
`completions` first, everything else by keyword (GRPO passes `prompts`, `completion_ids` and the
dataset's other columns). `None` means "this reward does not apply to this row" and is left out of the
weighted sum. Completions may be strings or conversational (a list of {"role", "content"} messages).
The maths that turns scores into training rewards (KL penalties, clipping, scaling) is in
`rlhfkit.core.rewards`.
"""

from rlhfkit.rewards.rules import (
    KeywordReward,
    LengthReward,
    accuracy_reward,
    completion_text,
    exact_match_reward,
    format_reward,
    length_penalty,
    soft_overlong_penalty,
    token_count_reward,
)
from rlhfkit.rewards.sentiment import SentimentJudge

__all__ = [
    "KeywordReward",
    "LengthReward",
    "SentimentJudge",
    "accuracy_reward",
    "completion_text",
    "exact_match_reward",
    "format_reward",
    "length_penalty",
    "soft_overlong_penalty",
    "token_count_reward",
]
