"""Short instruction-like prompts for RL learning tests, scored by the toy rule rewards.

`rlhfkit.rewards.KeywordReward` and `LengthReward` give a tiny random model a reward it can climb in a
few steps on these prompts.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from rlhfkit.tasks.sampling import seeded_sample

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

_PROMPT_HEADS = ("Say", "Write", "Tell me", "Give me", "Share", "Offer", "Type", "Print")
_PROMPT_OBJECTS = (
    "a word",
    "a line",
    "something",
    "a short note",
    "a phrase",
    "a thought",
    "a sentence",
    "a reply",
    "a greeting",
    "a wish",
)
_PROMPT_TOPICS = (
    "about cats",
    "about the sea",
    "for today",
    "about music",
    "about trees",
    "about rain",
    "about bread",
    "about trains",
    "about stars",
    "about tea",
)


def toy_prompts(split: str = "train", n: int | None = None, seed: int = 0) -> list[str]:
    """Short instruction-like prompts ("Say a word about cats:"); train and test share none.

    There are 800 distinct prompts, about 80% in "train"; `seed` shuffles, `n` truncates.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    prompts = [
        f"{head} {obj} {topic}:"
        for head in _PROMPT_HEADS
        for obj in _PROMPT_OBJECTS
        for topic in _PROMPT_TOPICS
    ]
    in_test = [zlib.crc32(p.encode("utf-8")) % 5 == 0 for p in prompts]
    chosen = [p for p, test in zip(prompts, in_test) if test == (split == "test")]
    return seeded_sample(chosen, split, n, seed)


def toy_prompt_dataset(split: str = "train", n: int | None = None, seed: int = 0) -> Dataset:
    """`toy_prompts` as a `datasets.Dataset` with a "prompt" column and its "query" alias."""
    from datasets import Dataset

    prompts = toy_prompts(split, n=n, seed=seed)
    return Dataset.from_dict({"prompt": prompts, "query": list(prompts)})
