"""The task registry resolves the built-in names and explains unknown ones."""

from __future__ import annotations

import pytest

from rlhfkit.tasks import KeywordReward, LengthReward, get_task, task_names


def test_names():
    assert task_names() == ["addition", "keyword", "length", "positive-review"]


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


def test_addition_task_scores_against_the_answer_column():
    task = get_task("addition")
    prompts = task.prompt_dataset("train", n=4, seed=0)
    assert prompts.column_names == ["prompt", "answer"] and len(prompts) == 4
    reward = task.column_reward
    scores = reward(["37+48=", "12+30=", "50+50="], ["85", "41", " 100 "], answer=["85", "42", "100"])
    assert scores == [1.0, 0.0, 1.0]
    a, b = (int(x) for x in prompts["prompt"][0].rstrip("=").split("+"))
    assert reward(prompts["prompt"][:1], [str(a + b)], answer=prompts["answer"][:1]) == [1.0]
    with pytest.raises(ValueError, match="'answer' column.*rlhfkit grpo --dataset_name addition"):
        task.reward_fn(["85"])


def test_text_tasks_have_no_column_reward():
    assert all(get_task(name).column_reward is None for name in ("keyword", "length"))
