"""The task registry resolves the built-in names and explains unknown ones."""

from __future__ import annotations

import pytest

from rlhfkit.tasks import KeywordReward, LengthReward, get_task, task_names


def test_names():
    assert task_names() == ["keyword", "length", "positive-review"]


def test_unknown_task_lists_the_names():
    with pytest.raises(ValueError, match="keyword, length, positive-review"):
        get_task("imdb")


def test_keyword_and_length_tasks():
    task = get_task("keyword", word="cat")
    assert task.name == "keyword" and isinstance(task.reward_fn, KeywordReward)
    assert task.reward_fn(["cat cat", "dog"]) == [2.0, 0.0]
    assert task.sft_dataset is None
    prompts = task.prompt_dataset("train", n=4)
    assert "prompt" in prompts.column_names and len(prompts) == 4
    length = get_task("length", target_words=3)
    assert isinstance(length.reward_fn, LengthReward) and length.reward_fn(["a b c"]) == [1.0]


def test_positive_review_task():
    pytest.importorskip("vaderSentiment")
    task = get_task("positive-review")
    prompts = task.prompt_dataset("test", n=5, seed=0)
    assert len(prompts) == 5
    scores = task.reward_fn(["a wonderful film", "an awful film"])
    assert scores[0] > 0 > scores[1]
    assert task.sft_dataset(n=10)["text"][0]
