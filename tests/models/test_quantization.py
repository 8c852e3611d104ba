"""8-bit / 4-bit base loading: a clear error without bitsandbytes; float32 adapters and value head with it."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from model_helpers import batch, policy_lora

from rlhfkit.models import quantization
from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead

pytestmark = pytest.mark.filterwarnings("ignore:no value head found", "ignore::UserWarning")


@pytest.mark.parametrize("flag", ["load_in_8bit", "load_in_4bit"])
def test_missing_bitsandbytes_names_the_extra(monkeypatch, llama_path, flag):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        quantization.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a),
    )
    with pytest.raises(ImportError, match=r"rlhfkit\[quant\]") as err:
        AutoModelForCausalLMWithValueHead.from_pretrained(llama_path, **{flag: True})
    assert flag in str(err.value)


def test_quantization_config_checks():
    assert quantization.bnb_quantization_config() is None
    with pytest.raises(ValueError, match="exclusive"):
        quantization.bnb_quantization_config(load_in_8bit=True, load_in_4bit=True)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["load_in_8bit", "load_in_4bit"])
def test_quantized_base_with_float32_adapters(llama_path, reward_adapter_dir, flag):
    pytest.importorskip("bitsandbytes")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        llama_path, peft_config=policy_lora(), reward_adapter=reward_adapter_dir, **{flag: True}
    )
    assert quantization.is_quantized(model.pretrained_model.get_base_model())
    lora = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert lora == {torch.float32} and model.v_head.summary.weight.dtype == torch.float32
    input_ids, mask = batch()
    logits, _, values = model(input_ids, attention_mask=mask)
    assert values.dtype == torch.float32 and torch.isfinite(logits).all()
    values.mean().backward()  # gradients reach the float32 adapters through the quantised base
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_" in n and ".default." in n)
    scores = model.sequence_reward_score(input_ids, attention_mask=mask)
    assert scores.shape == (3,) and torch.isfinite(scores).all()
