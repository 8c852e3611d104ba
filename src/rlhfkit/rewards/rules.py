"""Rule rewards: exact-match accuracy, regex format, length penalties (DAPO's soft overlong
punishment), and the toy keyword/length/token-count rewards of the learning tests.

Every text reward here has TRL's reward-function signature, `fn(completions, **columns) -> list`:
`completions` first (so `fn(texts)` works from a notebook or as an RLOO/PPO reward), everything else
by keyword (`prompts`, `completion_ids` and the dataset's other columns when GRPO calls it).

A conversational completion is scored on its final assistant message, the answer (`completion_text`):
with tools it is a list of messages (assistant, tool, assistant, ...) and a tool's result is not the
model's answer. TRL's own rewards read the first message, `completion[0]["content"]`, which is the same
message for the one-message completions they take, and the tool-calling turn of a longer conversation.
Lengths are counted in tokens when the trainer passes the `completion_ids` column (every token of the
completion, tool results included), otherwise in characters of all of the completion's messages (a
plain call from a notebook). Answers are compared after
extracting the final answer (the last `\\boxed{...}`, else the text after the last `####`, else
the whole text) and collapsing whitespace, on both the completion and the reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

RewardFn = Callable[..., list[float | None]]

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_WHITESPACE = re.compile(r"\s+")


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # multimodal content: a list of typed parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """The text a reward scores: a string as is; of a conversation, its final assistant message (the
    model's answer), so a tool's result or an earlier turn never counts as the answer.

    A message without a "role" is the model's (TRL's one-message completions may omit it). A conversation
    with no assistant message (it ended on a tool's result before the model spoke) has no answer: "".
    """
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role", "assistant") == "assistant":
            return _content_text(message)
    return ""


def _whole_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """All of a completion's text, every message's content joined (tool results included): its size, which
    `max_completion_length` bounds, rather than its answer."""
    if isinstance(completion, str):
        return completion
    return "".join(_content_text(message) for message in completion)


def final_answer(text: str) -> str:
    """The answer part of a completion or reference, whitespace collapsed."""
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    elif "####" in text:
        text = text.rsplit("####", 1)[1]
    return _WHITESPACE.sub(" ", text).strip()


def exact_match_reward(column: str = "solution") -> RewardFn:
    """A reward of 1.0 when the completion's final answer equals the row's `column`, else 0.0 (a
    conversation's answer is read from its final assistant message, never from a tool's result).

    A row whose reference is None, or a batch without that column, gets None (not applicable),
    so the reward can sit beside others on a dataset where only some rows are verifiable.
    """

    def reward(completions: list, **columns: Any) -> list[float | None]:
        references = columns.get(column)
        if references is None:
            return [None] * len(completions)
        if len(references) != len(completions):
            raise ValueError(
                f"column {column!r} has {len(references)} rows for {len(completions)} completions"
            )
        return [
            None if ref is None else float(final_answer(completion_text(c)) == final_answer(str(ref)))
            for c, ref in zip(completions, references)
        ]

    reward.__name__ = "accuracy_reward" if column == "solution" else f"accuracy_reward_{column}"
    return reward


accuracy_reward = exact_match_reward("solution")


def format_reward(
    pattern: str = r"<think>.*?</think>\s*<answer>.*?</answer>", flags: int = re.DOTALL
) -> RewardFn:
    """1.0 when the whole completion (of a conversation: its final assistant message; outer whitespace
    stripped) matches `pattern`, else 0.0.

    The default is DeepSeek-R1's reasoning format; `flags` default to DOTALL so `.` spans lines.
    """
    compiled = re.compile(pattern, flags)

    def reward(completions: list, **columns: Any) -> list[float | None]:
        return [float(compiled.fullmatch(completion_text(c).strip()) is not None) for c in completions]

    reward.__name__ = "format_reward"
    return reward


def _lengths(completions: list, completion_ids: list | None) -> list[int]:
    if completion_ids is None:
        return [len(_whole_text(c)) for c in completions]
    if len(completion_ids) != len(completions):
        raise ValueError(f"completion_ids has {len(completion_ids)} rows for {len(completions)} completions")
    return [len(ids) for ids in completion_ids]


def length_penalty(target_length: int, coef: float = 0.01) -> RewardFn:
    """-coef per unit of length beyond `target_length`, 0 within.

    Lengths are in tokens, or characters without completion_ids."""
    if target_length < 0:
        raise ValueError(f"target_length must be >= 0, got {target_length}")
    if coef < 0:
        raise ValueError(f"coef must be >= 0 (it is the size of a penalty), got {coef}")

    def reward(completions: list, completion_ids: list | None = None, **columns: Any) -> list:
        return [-coef * max(0, n - target_length) for n in _lengths(completions, completion_ids)]

    reward.__name__ = "length_penalty"
    return reward


def soft_overlong_penalty(max_completion_length: int, overlong_buffer: int) -> RewardFn:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13).

    0 up to L_max - buffer, then linear down to -1 at L_max, and -1 beyond L_max. Lengths in tokens
    when the trainer passes completion_ids, else in characters.
    """
    if max_completion_length <= 0:
        raise ValueError(f"max_completion_length must be > 0, got {max_completion_length}")
    if not 0 < overlong_buffer <= max_completion_length:
        raise ValueError(
            f"overlong_buffer must be in (0, max_completion_length={max_completion_length}], "
            f"got {overlong_buffer}"
        )
    free = max_completion_length - overlong_buffer

    def reward(completions: list, completion_ids: list | None = None, **columns: Any) -> list:
        return [
            max(-1.0, min(0.0, (free - n) / overlong_buffer)) for n in _lengths(completions, completion_ids)
        ]

    reward.__name__ = "soft_overlong_penalty"
    return reward


class KeywordReward:
    """1.0 per occurrence of `word` in a completion (case-insensitive), capped at `cap`, minus
    `length_penalty` per whitespace-separated word. A conversation is read from its final assistant message.

    Substring matching (not whole words) gives a random model a signal from its first steps.
    """

    def __init__(self, word: str = "good", cap: int = 5, length_penalty: float = 0.0) -> None:
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"word must be a non-empty string, got {word!r}")
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
        self.word, self.cap, self.length_penalty = word.strip().lower(), cap, length_penalty

    def __call__(self, completions: list[str], **columns: Any) -> list[float]:
        texts = _check_texts(completions)
        return [
            float(min(text.lower().count(self.word), self.cap)) - self.length_penalty * len(text.split())
            for text in texts
        ]


class LengthReward:
    """`1 - |words - target_words| / target_words`: 1 at exactly `target_words`, falling linearly (words of
    a conversation's final assistant message)."""

    def __init__(self, target_words: int = 2) -> None:
        if not isinstance(target_words, int) or target_words < 1:
            raise ValueError(f"target_words must be a positive int, got {target_words!r}")
        self.target_words = target_words

    def __call__(self, completions: list[str], **columns: Any) -> list[float]:
        texts = _check_texts(completions)
        target = self.target_words
        return [1.0 - abs(len(text.split()) - target) / target for text in texts]


def token_count_reward(responses: torch.Tensor, token_id: int, response_mask: torch.Tensor) -> torch.Tensor:
    """Fraction of real response tokens equal to `token_id`.

    Args: responses (B, T) token ids; response_mask (B, T), True/1 for a real token.
    Returns: (B,) float32 scores in [0, 1]; 0 for a response with no real tokens.
    """
    if responses.shape != response_mask.shape:
        raise ValueError(
            f"responses and response_mask must have the same shape, got {tuple(responses.shape)} "
            f"and {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    hits = ((responses == token_id) & mask).sum(dim=-1).float()
    return hits / mask.sum(dim=-1).clamp(min=1).float()


def _check_texts(completions: list[str]) -> list[str]:
    if isinstance(completions, str):
        raise TypeError("completions must be a list of strings, got a single str; wrap it in a list")
    return [completion_text(c) for c in completions]
