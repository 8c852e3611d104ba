"""PPO reuses the logprobs and values computed while sampling: they must equal a second forward pass.

Also the rules for when they are reused (only pairs generate() sampled with the current weights), the record
itself, and the fused optimizer the trainer builds by default.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from rlhfkit.rollout import HFGenerationBackend, SamplingParams, forward_response, pad_left
from rlhfkit.testing import tiny_model_path, tiny_tokenizer, tiny_value_head_model
from rlhfkit.trainers.common.optimizers import fused_optimizer_kwargs
from rlhfkit.trainers.ppo.sampling_cache import SamplingCache


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def value_head_model(arch: str) -> AutoModelForCausalLMWithValueHead:
    return tiny_value_head_model(arch, summary_dropout_prob=0.0)


@pytest.fixture(scope="module")
def base_model():
    torch.manual_seed(0)  # the value head's initialisation must not depend on which tests ran before
    return value_head_model("llama")


def queries_of(tokenizer, texts):
    return [torch.tensor(tokenizer.encode(t)) for t in texts]


TEXTS = ["the film", "a very long story about a", "it", "we left early because"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generation_logprobs_and_values_equal_a_forward_pass(arch, tokenizer):
    model = value_head_model(arch).eval()
    ids, mask = pad_left(queries_of(tokenizer, TEXTS), tokenizer.pad_token_id)
    params = SamplingParams(
        max_new_tokens=7, temperature=0.7, top_k=0, stop_token_ids=[tokenizer.eos_token_id]
    )
    backend = HFGenerationBackend(model, tokenizer.pad_token_id, chunk_size=3, value_head=model.v_head)
    torch.manual_seed(0)
    out = backend.generate(ids, mask, params, logprob_temperature=1.0)
    with torch.no_grad():  # the straightforward computation: one forward over query + response
        expected = forward_response(model, ids, mask, out.responses, out.response_mask, with_values=True)
    real = out.response_mask
    assert real.sum() > len(TEXTS)  # something was generated in every row
    torch.testing.assert_close(out.logprobs[real], expected.logprobs[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.values[real], expected.values[real], atol=1e-5, rtol=1e-5)


def test_value_head_needs_a_decoder_only_model(tokenizer):
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_path("t5"))
    with pytest.raises(ValueError, match="decoder-only"):
        HFGenerationBackend(model, 0, value_head=torch.nn.Linear(8, 1))


def make_trainer(base_model, tokenizer, sgd=False, **overrides):
    kwargs = dict(batch_size=4, mini_batch_size=2, ppo_epochs=2, learning_rate=1e-3, seed=0)
    kwargs.update(overrides)
    model = copy.deepcopy(base_model)
    optimizer = torch.optim.SGD(model.parameters(), lr=kwargs["learning_rate"]) if sgd else None
    return PPOTrainer(PPOConfig(**kwargs), model, tokenizer=tokenizer, optimizer=optimizer)


GEN = dict(do_sample=True, top_k=0, temperature=0.8, max_new_tokens=6)


def test_step_with_recorded_outputs_matches_recomputing_them(base_model, tokenizer):
    queries = queries_of(tokenizer, TEXTS)
    # SGD: Adam's first step moves a weight by about lr whatever its gradient's size, so float-rounding
    # differences in near-zero gradients would show up as lr-sized weight differences
    reuse, recompute = (
        make_trainer(base_model, tokenizer, sgd=True),
        make_trainer(base_model, tokenizer, sgd=True),
    )
    recompute.config.reuse_generation_outputs = False
    torch.manual_seed(0)
    responses = reuse.generate(queries, batch_size=3, return_prompt=False, **GEN)
    scores = [torch.tensor(float(i)) for i in range(len(queries))]
    torch.manual_seed(1)  # same minibatch order on both sides
    stats_reuse = reuse.step(queries, responses, scores)
    torch.manual_seed(1)
    stats_recompute = recompute.step(queries, responses, scores)
    assert stats_reuse["ppo/reused_generation_outputs"] == 1.0
    assert stats_recompute["ppo/reused_generation_outputs"] == 0.0
    for key in (
        "objective/logprobs",
        "objective/kl",
        "ppo/val/mean",
        "ppo/loss/total",
        "ppo/policy/ratio_mean",
    ):
        assert stats_reuse[key] == pytest.approx(stats_recompute[key], abs=1e-4), key
    for (name, a), b in zip(reuse.policy.named_parameters(), recompute.policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def test_outputs_are_reused_only_for_pairs_sampled_by_the_current_weights(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer, ppo_epochs=1)
    queries = queries_of(tokenizer, TEXTS)
    scores = [torch.tensor(1.0)] * 4
    torch.manual_seed(0)
    with_prompt = trainer.generate(queries, batch_size=4, **GEN)  # return_prompt=True: strip it ourselves
    responses = [full[len(q) :] for q, full in zip(queries, with_prompt)]
    assert trainer.step(queries, responses, scores)["ppo/reused_generation_outputs"] == 1.0
    # the same pairs again: the weights changed in between, so the record no longer applies
    assert trainer.step(queries, responses, scores)["ppo/reused_generation_outputs"] == 0.0
    torch.manual_seed(1)
    responses = trainer.generate(queries, batch_size=4, return_prompt=False, **GEN)
    edited = [responses[0].flip(0), *responses[1:]]
    assert trainer.step(queries, edited, scores)["ppo/reused_generation_outputs"] == 0.0
    # the config switch, and full-logit KL (which needs the logits) turn recording off
    trainer.config.kl_penalty = "full"
    trainer.generate(queries, batch_size=4, return_prompt=False, **GEN)
    assert len(trainer.rollouts) == 0


def test_low_precision_policies_recompute(base_model, tokenizer):
    """bf16 rounds the cached decoding path and a full forward differently: step() takes the forward pass."""
    trainer = PPOTrainer(
        PPOConfig(batch_size=4, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-3, seed=0),
        copy.deepcopy(base_model).to(torch.bfloat16),
        tokenizer=tokenizer,
    )
    queries = queries_of(tokenizer, TEXTS)
    torch.manual_seed(0)
    responses = trainer.generate(queries, batch_size=4, return_prompt=False, **GEN)
    assert len(trainer.rollouts) == 0
    stats = trainer.step(queries, responses, [torch.tensor(1.0)] * 4)
    assert stats["ppo/reused_generation_outputs"] == 0.0


def test_rollout_record_pads_evicts_and_checks_the_version():
    record = SamplingCache(capacity=2)
    q = [torch.tensor([5, 6]), torch.tensor([7])]
    r = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 9.0, 9.0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, 9.0]])
    record.add(q, r, logprobs, values, version=3)
    found = record.lookup(q, r, length=4, version=3)
    assert found is not None
    assert found[0].tolist() == [[-1.0, -2.0, -3.0, 0.0], [-4.0, 0.0, 0.0, 0.0]]
    assert found[1][1].tolist() == pytest.approx([0.4, 0.0, 0.0, 0.0])
    assert record.lookup(q, r, length=4, version=4) is None  # other weights
    assert record.lookup([q[0]], [torch.tensor([1, 2])], length=4, version=3) is None  # another response
    record.add([torch.tensor([8])], [torch.tensor([2])], logprobs[:1], values[:1], version=3)
    assert len(record) == 2 and record.lookup([q[0]], [r[0]], length=3, version=3) is None  # oldest evicted
    record.clear()
    assert len(record) == 0 and record.lookup(q[1:], r[1:], length=1, version=3) is None


def test_default_optimizer_is_fused_where_torch_has_the_kernel(base_model, tokenizer):
    trainer = make_trainer(base_model, tokenizer)
    assert trainer.optimizer.param_groups[0]["fused"] is True
    assert fused_optimizer_kwargs([torch.nn.Parameter(torch.zeros(2))]) == {"fused": True}
    assert fused_optimizer_kwargs([]) == {}
    assert fused_optimizer_kwargs([torch.zeros(2, dtype=torch.long)]) == {}
