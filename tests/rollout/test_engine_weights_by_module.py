"""`engine_weights_by_module`: a ZeRO-3 policy is sent to the engine one module at a time. DeepSpeed does not
run on CPU, so `StandInZero3` shards the tiny Llama (each weight emptied, its data kept aside) and its
gather puts the data back for the block, recording how many bytes are whole at once. (Against the real
engine: tests/rollout/test_vllm_server.py.)"""

from __future__ import annotations

import contextlib

import pytest
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


def test_a_lora_model_is_refused_naming_the_whole_model_gather():
    model = get_peft_model(tiny_model("llama"), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(
        ValueError, match=r"PEFT model cannot be synced shard by shard yet: leave the policy unsharded"
    ):
        next(engine_weights_by_module(model, lambda params: contextlib.nullcontext(), 2**20))
