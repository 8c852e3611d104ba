"""Two-digit addition ("37+48=" -> "85"): a task whose reward is computed exactly, with no judge.

Problems are every `a+b=` with `a`, `b` in [10, 99], so each prompt is six characters (and six tokens
of the tiny byte-level tokenizer). The train/test split is fixed by a hash of the *unordered* pair, so
a held-out problem is never a train problem, nor a train problem with its operands swapped; `seed`
only shuffles and subsamples within a split. The prompt datasets carry the exact answer in an "answer"
column, which `rlhfkit.rewards.exact_match_reward("answer")` compares a completion with.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from rlhfkit.tasks.sampling import seeded_sample

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

LOW, HIGH = 10, 99  # operand range, both ends included
TEST_FRACTION_DEN = 5  # about 1 unordered pair in 5 is held out
SPLITS = ("train", "test")


def _in_test(a: int, b: int) -> bool:
    low, high = min(a, b), max(a, b)
    return zlib.crc32(f"{low}+{high}".encode("ascii")) % TEST_FRACTION_DEN == 0


def addition_problems(split: str = "train", n: int | None = None, seed: int = 0) -> list[tuple[int, int]]:
    """The (a, b) pairs of one split, shuffled by `seed`; the first `n` (all when None).

    "train" holds 6499 ordered pairs and "test" 1601; no unordered pair is in both.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    pairs = [
        (a, b)
        for a in range(LOW, HIGH + 1)
        for b in range(LOW, HIGH + 1)
        if _in_test(a, b) == (split == "test")
    ]
    return seeded_sample(pairs, split, n, seed)


def addition_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def addition_prompt_dataset(split: str = "train", n: int | None = None, seed: int = 0) -> Dataset:
    """Prompts ("37+48=") and their exact answers ("85"): the RL and evaluation data."""
    from datasets import Dataset

    pairs = addition_problems(split, n=n, seed=seed)
    return Dataset.from_dict(
        {"prompt": [addition_prompt(a, b) for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
    )


def addition_sft_dataset(n: int | None = None, seed: int = 0) -> Dataset:
    """Train-split problems as prompt/completion pairs (the completion is the answer) for SFT."""
    from datasets import Dataset

    pairs = addition_problems("train", n=n, seed=seed)
    return Dataset.from_dict(
        {"prompt": [addition_prompt(a, b) for a, b in pairs], "completion": [str(a + b) for a, b in pairs]}
    )
