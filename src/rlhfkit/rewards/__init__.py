"""Rule-based ("verifiable") reward functions for GRPO-style trainers. Needs only the standard library.

Every reward function has the signature `fn(prompts, completions, **columns) -> list[float | None]`:
other dataset columns arrive by name, and the trainer adds `completion_ids` (token ids per
completion). `None` means "this reward does not apply to this row" and is skipped in the weighted
sum. Completions may be strings or conversational (a list of {"role", "content"} messages).
"""

from rlhfkit.rewards.rules import (
    accuracy_reward,
    completion_text,
    exact_match_reward,
    format_reward,
    length_penalty,
    soft_overlong_penalty,
)

__all__ = [
    "accuracy_reward",
    "completion_text",
    "exact_match_reward",
    "format_reward",
    "length_penalty",
    "soft_overlong_penalty",
]
