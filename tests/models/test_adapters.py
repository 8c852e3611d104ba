"""Multi-adapter RL: a frozen LoRA reward adapter and several policy adapters on one base model."""

from __future__ import annotations

import pytest
import torch
from model_helpers import batch, policy_lora

from rlhfkit.core.masking import last_true_indices
from rlhfkit.models import adapters
from rlhfkit.models.adapters import use_adapter
from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead

pytestmark = pytest.mark.filterwarnings("ignore:no value head found")


@pytest.fixture
def model(llama_path, reward_adapter_dir):
    return AutoModelForCausalLMWithValueHead.from_pretrained(
        llama_path, peft_config=policy_lora(), reward_adapter=reward_adapter_dir, summary_dropout_prob=0.0
    )


@pytest.fixture(scope="module")
def reward_model(reward_adapter_dir):
    """The reward model as RewardTrainer would use it: a standalone PEFT sequence classifier."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.testing import tiny_model_path

    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_path("llama-reward"))
    return PeftModel.from_pretrained(base, reward_adapter_dir).eval()


def test_last_real_token_index_for_both_padding_sides():
    # left padding: last real token is the last column; right padding: one before the first pad
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    assert last_true_indices(mask).tolist() == [3, 2, 0]


@pytest.mark.parametrize("left_pad", [True, False])
def test_scores_match_the_standalone_reward_model(model, reward_model, left_pad):
    input_ids, mask = batch(3, 9, left_pad=left_pad)
    per_token = model.compute_reward_score(input_ids, attention_mask=mask)
    assert per_token.shape == (3, 9, 1) and per_token.dtype == torch.float32 and not per_token.requires_grad
    scores = model.sequence_reward_score(input_ids, attention_mask=mask)
    assert scores.shape == (3,)
    with torch.no_grad():
        expected = reward_model(input_ids=input_ids, attention_mask=mask).logits.squeeze(-1)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    # the sequence score is the per-token score at the last real token (the last column when left-padded)
    torch.testing.assert_close(scores, per_token[torch.arange(3), last_true_indices(mask), 0])
    if left_pad:
        torch.testing.assert_close(per_token[:, -1, 0], expected, atol=1e-5, rtol=1e-5)


def test_reward_adapter_is_frozen_and_policy_stays_trainable(model):
    trainable_before = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable_before and not any(
        "reward_adapter" in n or n.startswith("score.") for n in trainable_before
    )
    model.train()
    model.compute_reward_score(*batch())
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable_before
    assert model.training and model.pretrained_model.active_adapter == "default"


def test_scores_unchanged_by_policy_updates(model):
    input_ids, mask = batch()
    scores_before = model.compute_reward_score(input_ids, attention_mask=mask)
    logits_before = model(input_ids, attention_mask=mask)[0].detach()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(2):
        logits, _, values = model(input_ids, attention_mask=mask)
        (logits.logsumexp(-1).mean() + values.pow(2).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.allclose(
        model(input_ids, attention_mask=mask)[0], logits_before, atol=1e-4
    )  # policy moved
    torch.testing.assert_close(
        model.compute_reward_score(input_ids, attention_mask=mask), scores_before, rtol=0, atol=0
    )


def test_several_policy_adapters(model):
    peft_model = model.pretrained_model
    peft_model.add_adapter("policy_1", policy_lora(r=2))
    with use_adapter(peft_model, "policy_1"):
        assert peft_model.active_adapter == "policy_1"
    assert peft_model.active_adapter == "default"
    input_ids, mask = batch()
    scores = model.compute_reward_score(input_ids, attention_mask=mask, ppo_adapter_name="policy_1")
    assert peft_model.active_adapter == "policy_1"  # switched back to the named policy, not "default"
    torch.testing.assert_close(model.compute_reward_score(input_ids, attention_mask=mask), scores)
    assert peft_model.active_adapter == "default"
    with pytest.raises(ValueError, match="ppo_adapter_name='nope'"):
        model.compute_reward_score(input_ids, attention_mask=mask, ppo_adapter_name="nope")
    assert peft_model.active_adapter == "default"


def test_active_adapter_restored_when_scoring_raises(model, monkeypatch):
    peft_model = model.pretrained_model
    peft_model.add_adapter("policy_1", policy_lora(r=2))
    peft_model.set_adapter("policy_1")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def boom(*args, **kwargs):
        assert peft_model.active_adapter == "reward_adapter"
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(adapters, "_backbone", lambda _: boom)
    with pytest.raises(RuntimeError, match="scoring failed"):
        model.compute_reward_score(*batch(), ppo_adapter_name="policy_1")
    assert peft_model.active_adapter == "policy_1"
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable


def test_reward_adapter_errors(llama_path, reward_adapter_dir, tmp_path):
    with pytest.raises(ValueError, match="PEFT policy"):
        AutoModelForCausalLMWithValueHead.from_pretrained(llama_path, reward_adapter=reward_adapter_dir)
    plain = AutoModelForCausalLMWithValueHead.from_pretrained(llama_path, peft_config=policy_lora())
    with pytest.raises(ValueError, match="no reward adapter loaded"):
        plain.compute_reward_score(*batch())
    with pytest.raises(ValueError, match="adapter_config.json"):
        plain.load_reward_adapter(tmp_path)
    # a causal-LM LoRA has no score head: not a reward adapter
    plain.pretrained_model.save_pretrained(tmp_path / "policy")
    with pytest.raises(ValueError, match="no score head"):
        plain.load_reward_adapter(tmp_path / "policy")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        llama_path, peft_config=policy_lora(), reward_adapter=reward_adapter_dir
    )
    input_ids, mask = batch()
    with pytest.raises(ValueError, match="at least one real token"):
        model.compute_reward_score(input_ids, attention_mask=torch.zeros_like(mask))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model.compute_reward_score(input_ids, attention_mask=mask[:, :3])


def test_save_load_several_policies_without_the_reward_adapter(model, tmp_path, reward_adapter_dir):
    peft_model = model.pretrained_model
    peft_model.add_adapter("policy_1", policy_lora(r=2))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n and ".policy_1." in n:
                p.add_(0.3)
    peft_model.set_adapter("policy_1")
    model.save_pretrained(tmp_path)
    assert not (tmp_path / "reward_adapter").exists()  # the reward adapter is an input, not saved
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(
        tmp_path, reward_adapter=reward_adapter_dir, summary_dropout_prob=0.0
    )
    assert set(loaded.pretrained_model.peft_config) == {"default", "policy_1", "reward_adapter"}
    assert loaded.pretrained_model.active_adapter == "policy_1"
    input_ids, mask = batch()
    model.eval(), loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids, attention_mask=mask)[0], model(input_ids, attention_mask=mask)[0]
        )
    scores = loaded.compute_reward_score(input_ids, mask, ppo_adapter_name="policy_1")
    torch.testing.assert_close(
        scores, model.compute_reward_score(input_ids, mask, ppo_adapter_name="policy_1")
    )


def test_reward_scorer_reads_a_reward_adapter_like_the_standalone_model(model, reward_model):
    from rlhfkit.rewards.scoring import RewardScorer
    from rlhfkit.rollout import pad_left, pad_right
    from rlhfkit.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer(padding_side="left")
    peft_model = model.pretrained_model
    peft_model.add_adapter("policy_1", policy_lora(r=2))
    peft_model.set_adapter("policy_1")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    queries = [torch.tensor(tokenizer(t)["input_ids"]) for t in ("the film was", "we left")]
    responses = [torch.tensor(tokenizer(t)["input_ids"]) for t in (" very good", " early and bored")]
    query_ids, query_mask = pad_left(queries, tokenizer.pad_token_id)
    response_ids, response_mask = pad_right(responses, tokenizer.pad_token_id)

    def halve(completions):
        return [0.5 * len(c) for c in completions]

    scorer = RewardScorer([model, halve], tokenizer, reward_weights=[2.0, 1.0])
    scores, per_source = scorer(query_ids, query_mask, response_ids, response_mask)
    ids = torch.cat([query_ids, response_ids], 1)
    mask = torch.cat([query_mask, response_mask.long()], 1)
    with torch.no_grad():
        expected = reward_model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    torch.testing.assert_close(per_source[0], expected, atol=1e-5, rtol=1e-5)
    # the completions decoded for the function: " very good" (10 chars), " early and bored" (16 chars)
    torch.testing.assert_close(per_source[1], torch.tensor([5.0, 8.0]))
    torch.testing.assert_close(scores, 2.0 * expected + torch.tensor([5.0, 8.0]), atol=1e-5, rtol=1e-5)
    # the policy is scored, not frozen, and its active adapter stays the one that was active
    assert peft_model.active_adapter == "policy_1"
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    # the same rows as the unpadded lists of the classic PPO loop
    listed, _ = scorer.score_responses(queries, responses)
    torch.testing.assert_close(listed, scores, atol=1e-5, rtol=1e-5)


def test_reward_scorer_needs_a_loaded_reward_adapter(llama_path):
    from rlhfkit.rewards.scoring import RewardScorer
    from rlhfkit.testing import tiny_tokenizer

    plain = AutoModelForCausalLMWithValueHead.from_pretrained(llama_path, peft_config=policy_lora())
    with pytest.raises(ValueError, match="no reward adapter loaded"):
        RewardScorer(plain, tiny_tokenizer())
