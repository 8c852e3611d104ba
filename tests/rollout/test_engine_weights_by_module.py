"""`engine_weights_by_module`: a ZeRO-3 policy is sent to the engine one module at a time. DeepSpeed does not
run on CPU, so `StandInZero3` shards the tiny Llama (each weight emptied, its data kept aside) and its
gather puts the data back for the block, recording how many bytes are whole at once. (Against the real
engine: tests/rollout/test_vllm_server.py.)"""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from rlhfkit.rollout.engine_weights import engine_weights, engine_weights_by_module
from rlhfkit.testing import tiny_model
from rlhfkit.testing.sharding import StandInZero3


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_a_sharded_model_is_sent_whole_while_at_most_one_layer_is_gathered():
    expected = {name: t.clone() for name, t in engine_weights(tiny_model("llama"))}
    model = tiny_model("llama")
    layers = model.model.layers
    layer_bytes = _bytes(layers[0].parameters())
    total = _bytes(expected.values())
    stand_in = StandInZero3(model)
    sent = {name: t.clone() for name, t in engine_weights_by_module(model, stand_in.gather, layer_bytes)}
    assert sent.keys() == expected.keys()  # the tied lm_head comes once, under the embedding's name, as there
    for name in expected:
        torch.testing.assert_close(sent[name], expected[name], rtol=0, atol=0)
    largest_tensor = max(_bytes([t]) for t in expected.values())
    assert stand_in.peak <= max(layer_bytes, largest_tensor) < total  # never the whole model at once
    assert stand_in.calls > len(layers) and stand_in.live == 0  # each layer alone, all released
    assert all(p.numel() == 0 for p in model.parameters())  # sharded again afterwards


def test_a_large_budget_gathers_the_model_in_one_block():
    model = tiny_model("llama")
    stand_in = StandInZero3(model)
    names = [name for name, _ in engine_weights_by_module(model, stand_in.gather, 2**40)]
    assert stand_in.calls == 1 and names == [name for name, _ in engine_weights(tiny_model("llama"))]


def _trained_lora_model():
    """The tiny Llama with LoRA on q/v (adapters moved off zero) and its final norm trained as a copy."""
    torch.manual_seed(0)
    config = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], modules_to_save=["model.norm"]
    )
    model = get_peft_model(tiny_model("llama"), config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def test_a_sharded_lora_model_is_sent_merged_one_layer_at_a_time():
    # the same names and tensors as the unsharded merge, with a LoRA layer gathered whole (its adapters
    # beside its base weight) and never the whole model
    expected = {name: t.clone() for name, t in engine_weights(_trained_lora_model())}
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    plain = dict(engine_weights(tiny_model("llama")))
    assert (expected[q_proj] - plain[q_proj]).abs().max() > 1e-2  # the merge is in what is expected
    assert (expected["model.norm.weight"] - plain["model.norm.weight"]).abs().max() > 1e-2  # the trained copy
    model = _trained_lora_model()
    total = _bytes(p for p in model.parameters())
    stand_in = StandInZero3(model)
    sent = {name: t.clone() for name, t in engine_weights_by_module(model, stand_in.gather, 2**10)}
    assert sent.keys() == expected.keys() == plain.keys()  # checkpoint names, no adapter tensors
    for name in expected:
        torch.testing.assert_close(sent[name], expected[name], rtol=0, atol=1e-6)
    assert stand_in.peak < total / 4 and stand_in.live == 0
    assert all(p.numel() == 0 for p in model.parameters())  # sharded again afterwards
