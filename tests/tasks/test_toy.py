"""Toy rewards checked by hand, and toy prompt splits."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rewards import KeywordReward, LengthReward, token_count_reward
from rlhfkit.tasks import toy_prompt_dataset, toy_prompts


def test_keyword_reward_counts_caps_and_penalises_length():
    reward = KeywordReward("good", cap=2)
    # "Good good" -> 2 (case-insensitive); "goodness" -> 1 (substring); 3 hits capped at 2; none -> 0
    assert reward(["Good good", "goodness", "good good good", "bad"]) == [2.0, 1.0, 2.0, 0.0]
    penalised = KeywordReward("good", cap=5, length_penalty=0.1)
    # 1 hit - 0.1 * 3 words = 0.7
    assert penalised(["good day sir"]) == pytest.approx([0.7])


def test_length_reward_peaks_at_target():
    reward = LengthReward(4)
    # 4 words -> 1; 2 words -> 1 - 2/4 = 0.5; 6 words -> 0.5; 0 words -> 0; 20 words -> 1 - 16/4 = -3
    texts = ["a b c d", "a b", "a b c d e f", "", " ".join(["w"] * 20)]
    assert reward(texts) == [1.0, 0.5, 0.5, 0.0, -3.0]


def test_token_count_reward_uses_only_real_tokens():
    responses = torch.tensor([[7, 7, 3, 0], [7, 1, 7, 7], [5, 5, 5, 5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    # row 0: 2 of 3 real tokens are 7 (the padded 0 does not count); row 1: 3 of 4; row 2: no real tokens -> 0
    scores = token_count_reward(responses, 7, mask)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert torch.allclose(scores, torch.tensor([2 / 3, 3 / 4, 0.0]))
    # naive loop cross-check on random input
    responses = torch.randint(0, 4, (6, 9))
    mask = torch.rand(6, 9) > 0.3
    fast = token_count_reward(responses, 2, mask)
    for i in range(6):
        real = [int(t) for t, m in zip(responses[i], mask[i]) if m]
        expected = real.count(2) / len(real) if real else 0.0
        assert fast[i].item() == pytest.approx(expected)


def test_length_reward_default_target_is_short():
    # a short target sits far from what a random model emits, so there is room to learn
    assert LengthReward()(["two words", "a b c d e f"]) == [1.0, -1.0]


def test_reward_arguments_are_validated():
    with pytest.raises(ValueError, match="word"):
        KeywordReward("  ")
    with pytest.raises(ValueError, match="target_words"):
        LengthReward(0)
    with pytest.raises(TypeError, match="list of strings"):
        LengthReward(3)("one string")
    with pytest.raises(ValueError, match="same shape"):
        token_count_reward(torch.zeros(2, 3), 1, torch.ones(2, 4))


def test_toy_prompts_split_and_seed():
    train, test = toy_prompts("train"), toy_prompts("test")
    assert len(train) + len(test) == 800 and not set(train) & set(test)
    assert 100 < len(test) < 250
    assert toy_prompts("train", n=16, seed=1) == toy_prompts("train", n=16, seed=1)
    dataset = toy_prompt_dataset("test", n=8)
    assert dataset.column_names == ["prompt", "query"] and len(dataset) == 8
