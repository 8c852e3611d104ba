"""The seeded draw of `n` prompts from one split, shared by the built-in tasks."""

from __future__ import annotations

import random


def seeded_sample(prompts: list[str], split: str, n: int | None, seed: int) -> list[str]:
    """`prompts` shuffled by `seed`, then the first `n` (all when None); asking for more is an error."""
    prompts = list(prompts)
    random.Random(seed).shuffle(prompts)
    if n is None:
        return prompts
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int or None, got {n!r}")
    if n > len(prompts):
        raise ValueError(f"n={n} but the {split!r} split has only {len(prompts)} distinct prompts")
    return prompts[:n]
