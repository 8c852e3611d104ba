"""Small learnable tasks for RL learning tests: a reward a tiny random model can climb in a few steps.

Each reward is a plain callable `list[str] -> list[float]` (or, for `token_count_reward`, a tensor
function on token ids), paired with a tiny prompt set from `toy_prompts`.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from rlhfkit.tasks.sampling import seeded_sample

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from datasets import Dataset

_PROMPT_HEADS = ("Say", "Write", "Tell me", "Give me", "Share", "Offer", "Type", "Print")
_PROMPT_OBJECTS = (
    "a word", "a line", "something", "a short note", "a phrase", "a thought", "a sentence", "a reply",
    "a greeting", "a wish",
)
_PROMPT_TOPICS = (
    "about cats", "about the sea", "for today", "about music", "about trees", "about rain",
    "about bread", "about trains", "about stars", "about tea",
)


class KeywordReward:
    """1.0 per occurrence of `word` in a completion (case-insensitive), capped at `cap`, minus
    `length_penalty` per whitespace-separated word.

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

    def __call__(self, texts: list[str]) -> list[float]:
        _check_texts(texts)
        return [
            float(min(text.lower().count(self.word), self.cap)) - self.length_penalty * len(text.split())
            for text in texts
        ]


class LengthReward:
    """`1 - |words - target_words| / target_words`: 1 at exactly `target_words`, falling linearly."""

    def __init__(self, target_words: int = 2) -> None:
        if not isinstance(target_words, int) or target_words < 1:
            raise ValueError(f"target_words must be a positive int, got {target_words!r}")
        self.target_words = target_words

    def __call__(self, texts: list[str]) -> list[float]:
        _check_texts(texts)
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


def _check_texts(texts: list[str]) -> None:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, got a single str; wrap it in a list")


def toy_prompts(split: str = "train", n: int | None = None, seed: int = 0) -> list[str]:
    """Short instruction-like prompts ("Say a word about cats:"); train and test share none.

    There are 800 distinct prompts, about 80% in "train"; `seed` shuffles, `n` truncates.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    prompts = [
        f"{head} {obj} {topic}:" for head in _PROMPT_HEADS for obj in _PROMPT_OBJECTS for topic in _PROMPT_TOPICS
    ]
    in_test = [zlib.crc32(p.encode("utf-8")) % 5 == 0 for p in prompts]
    chosen = [p for p, test in zip(prompts, in_test) if test == (split == "test")]
    return seeded_sample(chosen, split, n, seed)


def toy_prompt_dataset(split: str = "train", n: int | None = None, seed: int = 0) -> Dataset:
    """`toy_prompts` as a `datasets.Dataset` with a "prompt" column and its "query" alias."""
    from datasets import Dataset

    prompts = toy_prompts(split, n=n, seed=seed)
    return Dataset.from_dict({"prompt": prompts, "query": list(prompts)})
