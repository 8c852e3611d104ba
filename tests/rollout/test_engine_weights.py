"""`engine_weights`: the policy's weights under checkpoint names, LoRA merged without touching the model."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlhfkit.rollout.engine_weights import engine_weights
from rlhfkit.testing import tiny_model, tiny_value_head_model


def test_a_plain_model_gives_its_own_state_dict():
    model = tiny_model("llama")
    weights = dict(engine_weights(model))
    expected = model.state_dict()
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_the_names_are_those_of_the_saved_checkpoint_tied_weights_once(name, tmp_path):
    from safetensors import safe_open

    model = tiny_model(name)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as saved:
        assert set(dict(engine_weights(model))) == set(saved.keys())
    if name == "gpt2":  # its lm_head is the input embedding: sent once
        assert "lm_head.weight" not in dict(engine_weights(model))


def test_the_value_head_wrapper_is_looked_through():
    wrapped = tiny_value_head_model("llama")
    names = set(dict(engine_weights(wrapped)))
    assert names == set(tiny_model("llama").state_dict())  # no v_head, no pretrained_model. prefix


def _trained_lora(modules_to_save=None):
    model = get_peft_model(
        tiny_model("llama"),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=modules_to_save),
    )
    with torch.no_grad():  # B starts at zero; a non-zero B makes the merged weight differ from the base
        for name, param in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model


@pytest.mark.parametrize("modules_to_save", [None, ["lm_head"]])
def test_lora_is_merged_like_merge_and_unload_and_the_model_is_untouched(modules_to_save):
    model = _trained_lora(modules_to_save)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weights = dict(engine_weights(model))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    # the q_proj update really is in there: the merged weight differs from the frozen base weight
    q = "model.layers.0.self_attn.q_proj"
    base_weight = model.state_dict()[f"base_model.model.{q}.base_layer.weight"]
    assert not torch.allclose(weights[f"{q}.weight"], base_weight)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # adapters and base weights unchanged


def test_a_disabled_adapter_gives_the_base_weights():
    model = _trained_lora()
    with model.disable_adapter():
        weights = dict(engine_weights(model))
    base = model.get_base_model()
    q = "model.layers.0.self_attn.q_proj"
    assert torch.equal(weights[f"{q}.weight"], base.state_dict()[f"{q}.base_layer.weight"])


def test_every_merged_layer_comes_even_when_each_is_dropped_as_soon_as_read():
    # an engine loads one tensor and lets it go; the next merged tensor may then reuse its memory, which
    # must not make it look like a tied copy of the one before (the q_proj of every layer must come)
    model = get_peft_model(tiny_model("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    expected = list(tiny_model("llama").state_dict())
    for attempt in range(20):  # whether memory is reused depends on the allocator: give it chances
        names = []
        for name, tensor in engine_weights(model):
            names.append(name)
            del tensor  # as an engine does: its memory is free for the next merged tensor
        assert names == expected, f"attempt {attempt}"
