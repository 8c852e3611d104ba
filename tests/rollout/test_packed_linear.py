"""Sampling with the large linear layers on oneDNN: which layers are converted, that they are restored after,
and that greedy completions and their logprobs match the plain path (to float rounding)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import rlhfkit.rollout.packed_linear as packed_linear
from rlhfkit.rollout.backends import SamplingParams, make_generation_backend
from rlhfkit.rollout.packed_linear import packed_linears
from rlhfkit.rollout.scoring import forward_response

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _model():
    # MLP 1,024 x 512 and the 512 x 1,024 head: packed; attention 512 x 512 (2^18 weights) and 64 x 512: not
    config = Qwen2Config(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # peaked next-token distributions, so greedy choices are far from ties
        model.lm_head.weight.mul_(40)
    return model


def test_only_large_linear_layers_are_converted_and_all_are_restored():
    model = _model()
    x = torch.randn(3, 5, 512)
    expected = model.model.layers[0].mlp.up_proj(x)
    with torch.no_grad(), packed_linears(model) as count:
        assert count == 2 * 3 + 1  # gate, up and down of each layer, and the head
        up = model.model.layers[0].mlp.up_proj
        assert "forward" in up.__dict__ and "forward" not in model.model.layers[0].self_attn.q_proj.__dict__
        torch.testing.assert_close(up(x), expected, rtol=1e-5, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules())  # the class's own forward again
    with packed_linears(model) as count:  # gradients on: a training pass is never converted
        assert count == 0
    from accelerate.hooks import ModelHook, add_hook_to_module

    add_hook_to_module(model.lm_head, ModelHook())  # e.g. offloading: accelerate's forward must run
    with torch.no_grad(), packed_linears(model) as count:
        assert count == 2 * 3 and "_hf_hook" in model.lm_head.__dict__


def test_greedy_completions_and_logprobs_match_the_plain_path(monkeypatch):
    model = _model()
    backend = make_generation_backend(model, pad_token_id=0)
    query = torch.randint(1, 1024, (4, 6))
    params = SamplingParams(max_new_tokens=12, do_sample=False, extra={"min_new_tokens": 12})
    fast = backend.generate(query, torch.ones_like(query), params, logprob_temperature=1.0)
    monkeypatch.setattr(packed_linear, "PACK_MIN_ELEMENTS", 10**12)  # nothing packed
    plain = backend.generate(query, torch.ones_like(query), params, logprob_temperature=1.0)
    assert torch.equal(fast.responses, plain.responses)
    torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-4)
    with torch.no_grad():  # and the training forward (never packed) scores them alike
        scored = forward_response(model, query, torch.ones_like(query), fast.responses, fast.response_mask)
    torch.testing.assert_close(fast.logprobs, scored.logprobs, rtol=0, atol=1e-4)


def _lora_model(**lora_kwargs):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(), LoraConfig(r=4, target_modules=["up_proj", "q_proj"], **lora_kwargs))
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    return model.eval()


def test_a_lora_layer_runs_as_one_product_on_its_merged_weight():
    model = _lora_model()
    lora_up = model.base_model.model.model.layers[0].mlp.up_proj
    weight_before = lora_up.base_layer.weight.clone()
    x = torch.randn(3, 5, 512)
    with torch.no_grad():
        expected = lora_up(x)
        with packed_linears(model) as count:
            # per layer gate, up (as its LoRA wrapper) and down, and the head; q_proj's base is too small
            assert count == 2 * 3 + 1
            assert "forward" in lora_up.__dict__ and "forward" not in lora_up.base_layer.__dict__
            torch.testing.assert_close(lora_up(x), expected, rtol=1e-4, atol=1e-4)
            q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
            assert "forward" not in q_proj.__dict__
    assert torch.equal(lora_up.base_layer.weight, weight_before)  # the model's weights never change
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad(), model.disable_adapter(), packed_linears(model) as count:
        # adapters off: the LoRA layer is its base, which is packed as a plain layer
        assert count == 2 * 3 + 1 and "forward" in lora_up.base_layer.__dict__
        assert "forward" not in lora_up.__dict__


def test_lora_layers_the_merge_cannot_stand_for_keep_their_forward():
    dora = _lora_model(use_dora=True)
    with torch.no_grad(), packed_linears(dora):
        up = dora.base_model.model.model.layers[0].mlp.up_proj
        assert "forward" not in up.__dict__ and "forward" in up.base_layer.__dict__
    dropout = _lora_model(lora_dropout=0.5).train()
    with torch.no_grad(), packed_linears(dropout):
        up = dropout.base_model.model.model.layers[0].mlp.up_proj
        assert "forward" not in up.__dict__


def test_lora_policy_samples_the_same_greedy_completions(monkeypatch):
    model = _lora_model()
    backend = make_generation_backend(model, pad_token_id=0)
    query = torch.randint(1, 1024, (4, 6))
    params = SamplingParams(max_new_tokens=12, do_sample=False, extra={"min_new_tokens": 12})
    fast = backend.generate(query, torch.ones_like(query), params, logprob_temperature=1.0)
    monkeypatch.setattr(packed_linear, "PACK_MIN_ELEMENTS", 10**12)
    plain = backend.generate(query, torch.ones_like(query), params, logprob_temperature=1.0)
    assert torch.equal(fast.responses, plain.responses)
    torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-4)
