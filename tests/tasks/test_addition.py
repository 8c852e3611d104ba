"""The addition task: seeded, disjoint splits and an exact reward."""

from __future__ import annotations

import pytest

from rlhfkit.tasks.addition import (
    addition_problems,
    addition_prompt_dataset,
    addition_sft_dataset,
)


def test_splits_cover_every_problem_once_and_never_share_a_pair():
    train, test = addition_problems("train"), addition_problems("test")
    assert len(train) + len(test) == 90 * 90  # every a+b with a, b in [10, 99]
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    unordered = lambda pairs: {frozenset(p) for p in pairs}  # noqa: E731
    # no held-out problem is a train problem, nor one with its operands swapped
    assert not unordered(train) & unordered(test)
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.25


def test_seed_shuffles_within_a_split_and_is_deterministic():
    assert addition_problems("test", n=20, seed=3) == addition_problems("test", n=20, seed=3)
    assert addition_problems("test", n=20, seed=3) != addition_problems("test", n=20, seed=4)
    assert set(addition_problems("test", seed=3)) == set(addition_problems("test", seed=4))
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        addition_problems("validation")


def test_datasets_hold_prompt_and_exact_answer():
    rows = addition_prompt_dataset("test", n=50, seed=0)
    for prompt, answer in zip(rows["prompt"], rows["answer"]):
        a, b = prompt.rstrip("=").split("+")
        assert prompt.endswith("=") and int(answer) == int(a) + int(b)
    sft = addition_sft_dataset(n=10, seed=0)
    assert sft.column_names == ["prompt", "completion"]
    train_prompts = set(addition_prompt_dataset("train")["prompt"])
    assert set(sft["prompt"]) <= train_prompts


def test_the_answer_column_scores_completions_exactly():
    from rlhfkit.rewards import exact_match_reward

    reward = exact_match_reward("answer")  # what the demo's GRPO stage uses
    rows = addition_prompt_dataset("test", n=2, seed=0)
    right, other = rows["answer"]
    completions = [right, f" {right}\n", right + "1", f"{right} and", other, ""]
    answers = [right] * len(completions)
    assert reward(completions, prompts=rows["prompt"][:1] * 6, answer=answers) == [
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
