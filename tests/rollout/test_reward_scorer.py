"""RewardScorer on the classic PPO loop's unpadded lists: the same scores as on a padded batch."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.rollout import pad_left, pad_right, reward_model_scores
from rlhfkit.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _encode(tokenizer, texts):
    return [torch.tensor(tokenizer(t)["input_ids"]) for t in texts]


def test_lists_and_padded_batch_agree_for_a_reward_model(tokenizer):
    reward_model = tiny_model("llama-reward")
    queries = _encode(tokenizer, ["the film was", "we left", "a long and winding plot"])
    responses = _encode(tokenizer, [" very good", " early and bored", " ok"])
    scorer = RewardScorer(reward_model, tokenizer)
    listed, per_source = scorer.score_responses(queries, responses)
    assert listed.shape == (3,) and per_source.shape == (1, 3)
    padded, _ = scorer(
        *pad_left(queries, tokenizer.pad_token_id), *pad_right(responses, tokenizer.pad_token_id)
    )
    torch.testing.assert_close(listed, padded, atol=1e-5, rtol=1e-5)
    # each row on its own, without any padding
    single = torch.cat(
        [
            reward_model_scores(
                reward_model, torch.cat([q, r])[None], torch.ones(1, len(q) + len(r), dtype=torch.long)
            )
            for q, r in zip(queries, responses)
        ]
    )
    torch.testing.assert_close(listed, single, atol=1e-5, rtol=1e-5)


def test_lists_with_texts_and_a_retokenizing_reward_model(tokenizer):
    reward_model = tiny_model("llama-reward")
    other = tiny_tokenizer(padding_side="right")  # the reward model's own tokenizer: text is re-encoded
    prompts, completions = ["the film was", "we left"], [" very good", " early"]
    queries, responses = _encode(tokenizer, prompts), _encode(tokenizer, completions)
    direct, _ = RewardScorer(reward_model, tokenizer).score_responses(queries, responses)

    def chars(texts):
        return [len(t) for t in texts]

    scorer = RewardScorer(
        [reward_model, chars],
        tokenizer,
        reward_processing_class=[other, None],
        reward_weights=[1.0, 0.5],
        add_special_tokens=True,
    )
    scores, per_source = scorer.score_responses(queries, responses, prompts, completions)
    torch.testing.assert_close(per_source[0], direct, atol=1e-5, rtol=1e-5)  # same text, same ids here
    # len of the completions: 10 and 6 characters, weighted by 0.5
    torch.testing.assert_close(per_source[1], torch.tensor([10.0, 6.0]))
    torch.testing.assert_close(scores, direct + torch.tensor([5.0, 3.0]), atol=1e-5, rtol=1e-5)


def test_lists_must_pair_up(tokenizer):
    with pytest.raises(ValueError, match="2 queries for 1 responses"):
        RewardScorer(len, tokenizer).score_responses(
            _encode(tokenizer, ["a", "b"]), _encode(tokenizer, ["c"])
        )
