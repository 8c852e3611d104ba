"""The task registry resolves the built-in names and explains unknown ones."""

from __future__ import annotations

import pytest

from rlhfkit.rewards import KeywordReward, LengthReward
from rlhfkit.tasks import get_task, task_names


def test_names():
    assert task_names() == ["addition", "calculator", "keyword", "length", "positive-review"]


def test_unknown_task_lists_the_names():
    with pytest.raises(ValueError, match="keyword, length, positive-review"):
        get_task("imdb")


def test_keyword_and_length_tasks():
    task = get_task("keyword", word="cat")
    assert task.name == "keyword" and isinstance(task.reward, KeywordReward)
    assert task.reward(["cat cat", "dog"]) == [2.0, 0.0]
    assert task.sft_dataset is None
    prompts = task.prompt_dataset("train", n=4)
    assert "prompt" in prompts.column_names and len(prompts) == 4
    length = get_task("length", target_words=3)
    assert isinstance(length.reward, LengthReward) and length.reward(["a b c"]) == [1.0]


def test_positive_review_task():
    pytest.importorskip("vaderSentiment")
    task = get_task("positive-review")
    prompts = task.prompt_dataset("test", n=5, seed=0)
    assert len(prompts) == 5
    scores = task.reward(["a wonderful film", "an awful film"])
    assert scores[0] > 0 > scores[1]
    assert task.sft_dataset(n=10)["text"][0]


def test_addition_task_scores_against_the_answer_column():
    task = get_task("addition")
    prompts = task.prompt_dataset("train", n=4, seed=0)
    assert prompts.column_names == ["prompt", "answer"] and len(prompts) == 4
    assert task.reward_columns == ("answer",)
    scores = task.reward(
        ["85", "41", " 100 "], prompts=["37+48=", "12+30=", "50+50="], answer=["85", "42", "100"]
    )
    assert scores == [1.0, 0.0, 1.0]
    a, b = (int(x) for x in prompts["prompt"][0].rstrip("=").split("+"))
    assert task.reward([str(a + b)], prompts=prompts["prompt"][:1], answer=prompts["answer"][:1]) == [1.0]
    assert task.reward(["85"]) == [None]  # without its column the reward does not apply
    with pytest.raises(ValueError, match="'answer' column.*rlhfkit grpo --dataset_name addition"):
        task.text_reward("--dataset_name", "RLOO's reward")


def test_text_tasks_read_no_columns():
    assert all(get_task(name).reward_columns == () for name in ("keyword", "length"))
    assert get_task("keyword").text_reward("--dataset_name", "RLOO's reward")(["good"]) == [1.0]
