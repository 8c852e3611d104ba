"""RLOO reward plumbing: weighted reward sources, re-tokenising reward models, bad rewards, KL placement."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.core.rewards import compute_rlhf_reward
from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.rollout import pad_left, pad_right, reward_model_scores
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.trainers.common.guards import NonFiniteStepWarning


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(padding_side="left")


def _batch(tokenizer, prompts, completions):
    query_ids, query_mask = pad_left(
        [torch.tensor(tokenizer(p)["input_ids"]) for p in prompts], tokenizer.pad_token_id
    )
    responses, response_mask = pad_right(
        [torch.tensor(tokenizer(c)["input_ids"]) for c in completions], tokenizer.pad_token_id
    )
    return query_ids, query_mask, responses, response_mask


def test_weighted_reward_functions_and_prompts_keyword(tokenizer):
    def length(completions):
        return [float(len(c)) for c in completions]

    seen = {}

    def prompt_aware(completions, prompts):
        seen["prompts"] = prompts
        return [1.0 if "cat" in p else 0.0 for p in prompts]

    scorer = RewardScorer([length, prompt_aware], tokenizer, reward_weights=[2.0, -1.0])
    prompts, completions = ["a cat", "a dog"], ["abc", "de"]
    scores, per_source = scorer(*_batch(tokenizer, prompts, completions), prompts, completions)
    # 2 * len - [cat in prompt]: 2*3 - 1 = 5, 2*2 - 0 = 4
    torch.testing.assert_close(scores, torch.tensor([5.0, 4.0]))
    torch.testing.assert_close(per_source, torch.tensor([[3.0, 2.0], [1.0, 0.0]]))
    assert seen["prompts"] == prompts


@pytest.mark.parametrize(
    "result, error, match",
    [
        ([1.0], ValueError, "returned 1 scores for 2 completions"),
        (["a", "b"], TypeError, "returned str 'a' for row 0 .* must be a real number"),
    ],
)
def test_bad_reward_function_output_names_the_function(tokenizer, result, error, match):
    def my_reward(completions):
        return result

    scorer = RewardScorer(my_reward, tokenizer)
    with pytest.raises(error, match=match) as info:
        scorer(*_batch(tokenizer, ["x", "y"], ["a", "b"]), ["x", "y"], ["a", "b"])
    assert "my_reward" in str(info.value)


def test_non_finite_scores_warn_naming_the_function(tokenizer):
    # not an error: the trainer skips the update (rlhfkit.trainers.common.guards.NonFiniteGuard)
    def my_reward(completions):
        return [1.0, float("inf")]

    scorer = RewardScorer(my_reward, tokenizer)
    with pytest.warns(NonFiniteStepWarning, match="my_reward.*non-finite"):
        scores, _ = scorer(*_batch(tokenizer, ["x", "y"], ["a", "b"]), ["x", "y"], ["a", "b"])
    assert scores[1] == float("inf")


def test_weights_must_match_sources(tokenizer):
    with pytest.raises(ValueError, match="reward_weights has 1 entries for 2"):
        RewardScorer([len, len], tokenizer, reward_weights=[1.0])
    with pytest.raises(TypeError, match="reward_model"):
        RewardScorer(3, tokenizer)


def test_reward_model_with_its_own_tokenizer_sees_the_same_text(tokenizer):
    reward_model = tiny_model("llama-reward")
    other = tiny_tokenizer(padding_side="right")  # another tokenizer object: decode and re-encode
    prompts, completions = ["the film was", "we left"], [" very good", " early and bored"]
    batch = _batch(tokenizer, prompts, completions)
    direct, _ = RewardScorer(reward_model, tokenizer)(*batch)
    retokenized, _ = RewardScorer(reward_model, tokenizer, reward_processing_class=other)(
        *batch, prompts, completions
    )
    # these texts survive the decode / encode round trip with identical ids, so the scores must agree
    torch.testing.assert_close(retokenized, direct, atol=1e-5, rtol=1e-5)
    ids = torch.cat([batch[0], batch[2]], 1)
    mask = torch.cat([batch[1], batch[3].long()], 1)
    torch.testing.assert_close(direct, reward_model_scores(reward_model, ids, mask))


def test_token_and_sequence_level_kl_give_the_same_total_reward():
    torch.manual_seed(0)
    scores = torch.randn(6)
    logprobs, ref_logprobs = -torch.rand(6, 5), -torch.rand(6, 5)
    response_mask = torch.arange(5)[None, :] < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]
    seq = compute_rlhf_reward(scores, logprobs, ref_logprobs, response_mask, 0.1, token_level_kl=False)
    tok = compute_rlhf_reward(scores, logprobs, ref_logprobs, response_mask, 0.1, token_level_kl=True)
    for a, b in zip(seq, tok):
        torch.testing.assert_close(a, b)
    # both give one reward per completion, and the per-token KL
    assert seq.reward.shape == tok.reward.shape == seq.non_score_reward.shape == (6,)
    assert seq.kl.shape == tok.kl.shape == (6, 5)
    # by hand: score - 0.1 * sum over real tokens of (logprob - ref_logprob)
    expected = scores - 0.1 * ((logprobs - ref_logprobs) * response_mask).sum(1)
    torch.testing.assert_close(seq[0], expected)


@pytest.mark.parametrize("token_level_kl", [False, True])
def test_normalize_reward_standardises_and_clips_the_raw_scores_before_the_kl_term(token_level_kl):
    scores = torch.tensor([1.0, 3.0, 5.0, 7.0])
    logprobs = torch.tensor([[-0.5], [-1.0], [-1.0], [-1.0]])
    ref_logprobs = torch.tensor([[-1.0], [-1.0], [-1.0], [-1.0]])  # KL 0.5 on the first completion only
    response_mask = torch.ones(4, 1, dtype=torch.bool)
    reward, non_score, _ = compute_rlhf_reward(
        scores, logprobs, ref_logprobs, response_mask, 0.1, token_level_kl, normalize_clip_range=1.0
    )
    # by hand: mean 4, sample std sqrt((9 + 1 + 1 + 9) / 3) = 2.5820
    # -> z = [-1.1619, -0.3873, 0.3873, 1.1619], clipped to +-1 -> [-1, -0.3873, 0.3873, 1];
    # then the KL term -0.1 * 0.5 = -0.05 on the first
    z = 1.0 / (20.0 / 3.0) ** 0.5
    torch.testing.assert_close(non_score, torch.tensor([-0.05, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(reward, torch.tensor([-1.05, -z, z, 1.0]))
    # without normalisation the raw score minus the same KL term
    raw, _, _ = compute_rlhf_reward(scores, logprobs, ref_logprobs, response_mask, 0.1, token_level_kl)
    torch.testing.assert_close(raw, torch.tensor([0.95, 3.0, 5.0, 7.0]))
