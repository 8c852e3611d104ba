"""PPOTrainer invariants: batch layout must not change the numbers; frozen parts must stay frozen."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from peft import LoraConfig, TaskType
from transformers import AutoModelForCausalLM

from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from rlhfkit.testing import tiny_model_path, tiny_tokenizer, tiny_value_head_model


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def base_model():
    return tiny_value_head_model("llama", summary_dropout_prob=0.0)


def rollout(n=8, seed=0):
    """Queries and responses of different lengths, so padding and token counts differ per sample."""
    g = torch.Generator().manual_seed(seed)
    queries = [torch.randint(10, 900, (2 + (i * 3) % 5,), generator=g) for i in range(n)]
    responses = [torch.randint(10, 900, (1 + (i * 5) % 7,), generator=g) for i in range(n)]
    scores = [torch.tensor(float(i % 3) - 1.0) for i in range(n)]
    return queries, responses, scores


def sgd_trainer(base_model, tokenizer, **kwargs):
    # SGD: the update is proportional to the gradient, so equal updates mean equal gradients (Adam's
    # first step is ~lr * sign(g) and would hide differences or amplify rounding around g = 0)
    model = copy.deepcopy(base_model)
    config = PPOConfig(seed=0, learning_rate=0.5, **kwargs)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    return PPOTrainer(config, model, tokenizer=tokenizer, optimizer=optimizer)


def test_logprobs_do_not_depend_on_padding_or_forward_chunks(base_model, tokenizer):
    trainer = sgd_trainer(base_model, tokenizer, batch_size=8, mini_batch_size=8)
    queries, responses, _ = rollout()
    results = []
    for chunk in (8, 3, 1):
        trainer.config.mini_batch_size = chunk  # the forward-pass chunk size
        logprobs, _, values, mask = trainer.batched_forward_pass(trainer.policy, queries, responses)
        results.append((logprobs, values))
    for logprobs, values in results[1:]:
        torch.testing.assert_close(logprobs, results[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(values, results[0][1], atol=1e-5, rtol=0)
    # each sample alone (no padding at all) gives the same numbers as inside the padded batch
    for i, (q, r) in enumerate(zip(queries, responses)):
        alone, _, value_alone, _ = trainer.batched_forward_pass(trainer.policy, [q], [r])
        torch.testing.assert_close(alone[0, : len(r)], results[0][0][i, : len(r)], atol=1e-5, rtol=0)
        torch.testing.assert_close(value_alone[0, : len(r)], results[0][1][i, : len(r)], atol=1e-5, rtol=0)
        assert (results[0][0][i, len(r) :] == 0).all()  # padding positions are zeroed


@pytest.mark.parametrize("mini_batch_size, accumulation", [(1, 8), (2, 4)])
def test_minibatch_times_accumulation_gives_the_same_update(
    base_model, tokenizer, mini_batch_size, accumulation
):
    batch = rollout()
    reference = sgd_trainer(base_model, tokenizer, batch_size=8, mini_batch_size=8, ppo_epochs=2)
    stats_ref = reference.step(*batch)
    split = sgd_trainer(
        base_model,
        tokenizer,
        batch_size=8,
        mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=accumulation,
        ppo_epochs=2,
    )
    stats_split = split.step(*batch)
    assert stats_ref["ppo/optimizer_steps"] == stats_split["ppo/optimizer_steps"] == 2.0
    for (name, p_ref), (_, p_split) in zip(
        reference.policy.named_parameters(), split.policy.named_parameters()
    ):
        torch.testing.assert_close(p_split, p_ref, atol=2e-6, rtol=1e-5, msg=name)
    # the update is real, not zero: weights moved from the initial model
    initial = dict(base_model.named_parameters())
    assert any(not torch.allclose(p, initial[n]) for n, p in reference.policy.named_parameters())


def test_tokenizer_padding_side_does_not_change_the_update(base_model, tokenizer):
    batch = rollout()
    trainers = []
    for side in ("left", "right"):
        trainer = sgd_trainer(base_model, tiny_tokenizer(padding_side=side), batch_size=8, mini_batch_size=4)
        stats = trainer.step(*batch)
        trainers.append((trainer, stats))
    (left, stats_left), (right, stats_right) = trainers
    for key in ("objective/kl", "ppo/loss/total", "ppo/val/vpred", "ppo/returns/mean"):
        assert stats_left[key] == pytest.approx(stats_right[key], abs=1e-6), key
    for p_left, p_right in zip(left.policy.parameters(), right.policy.parameters()):
        torch.testing.assert_close(p_left, p_right, atol=1e-6, rtol=0)


def test_shared_layers_receive_no_gradient(base_model, tokenizer):
    model = copy.deepcopy(base_model)
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-2),
        model,
        tokenizer=tokenizer,
        num_shared_layers=1,
    )
    shared = {n for n, p in trainer.policy.named_parameters() if not p.requires_grad}
    assert any("layers.0." in n for n in shared) and any("embed_tokens" in n for n in shared)
    assert not any("layers.1." in n for n in shared)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    q, r, s = rollout(n=4)
    trainer.step(q, r, s)
    for name, param in trainer.policy.named_parameters():
        if name in shared:
            assert param.grad is None and torch.equal(param, before[name]), name
    assert any(
        not torch.equal(p, before[n]) for n, p in trainer.policy.named_parameters() if "layers.1." in n
    )
    # the reference holds the very same tensors for the shared part, a frozen copy for the rest
    ref_params = dict(trainer.ref_model.named_parameters())
    name0 = next(n for n in shared if "layers.0." in n)
    assert ref_params[name0].data_ptr() == dict(trainer.policy.named_parameters())[name0].data_ptr()


def test_lora_policy_trains_only_adapter_and_value_head(tokenizer):
    lora = LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            tiny_model_path("llama"), peft_config=lora, summary_dropout_prob=0.0
        )
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=4, learning_rate=1e-2),
        model,
        tokenizer=tokenizer,
    )
    assert trainer.is_peft_model and trainer.ref_model is None  # no second copy of the weights
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    q, r, s = rollout(n=4)
    for _ in range(2):
        trainer.step(q, r, s)
    changed = {n for n, p in trainer.policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n or n.startswith("v_head") for n in changed), changed
    assert any("lora_" in n for n in changed) and any(n.startswith("v_head") for n in changed)
    # the reference is the base model with the adapter disabled
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    with trainer._reference() as ref:
        ref_logprobs, _, _, mask = trainer.batched_forward_pass(ref, q, r)
    policy_logprobs, _, _, _ = trainer.batched_forward_pass(trainer.policy, q, r)
    plain_logprobs, _, values, _ = trainer.batched_forward_pass(plain, q, r)
    assert values is None  # a plain LM has no value head
    torch.testing.assert_close(ref_logprobs, plain_logprobs, atol=1e-5, rtol=0)
    assert (policy_logprobs - ref_logprobs).abs().max() > 1e-4  # the adapter did change the policy
    stats = trainer.step(q, r, s)
    assert stats["objective/kl"] != 0.0


def test_multi_adapter_rl_reward_adapter_scores_and_stays_frozen(tokenizer, tmp_path):
    """Seed 004: one base model carries the policy LoRA and a frozen LoRA reward adapter."""
    from peft import get_peft_model

    from rlhfkit.rollout import pad_left
    from rlhfkit.testing import tiny_model

    reward = get_peft_model(
        tiny_model("llama-reward"),
        LoraConfig(
            task_type=TaskType.SEQ_CLS, r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    reward.save_pretrained(tmp_path / "rm_adapter")
    policy_lora = LoraConfig(
        task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            tiny_model_path("llama"),
            peft_config=policy_lora,
            reward_adapter=str(tmp_path / "rm_adapter"),
            summary_dropout_prob=0.0,
        )
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=2, learning_rate=1e-2),
        model,
        tokenizer=tokenizer,
    )
    q, r, _ = rollout(n=4)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    ids, mask = pad_left([torch.cat([a, b]) for a, b in zip(q, r)], tokenizer.pad_token_id)
    scores = trainer.model.sequence_reward_score(input_ids=ids, attention_mask=mask)
    assert scores.shape == (4,)
    trainer.step(q, r, list(scores))
    changed = {n for n, p in trainer.policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and not any("reward_adapter" in n for n in changed)
    assert all(".default." in n or n.startswith("v_head") for n in changed), changed
    # scoring again gives the same scores: the reward adapter did not move
    torch.testing.assert_close(
        trainer.model.sequence_reward_score(input_ids=ids, attention_mask=mask), scores
    )
