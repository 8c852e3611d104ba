"""Value-head wrappers: shapes, dtype, init, dropout, and exact save/load round trips."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from model_helpers import batch, policy_lora
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rlhfkit.models.value_head import (
    VALUE_HEAD_FILE,
    AutoModelForCausalLMWithValueHead,
    AutoModelForSeq2SeqLMWithValueHead,
    PreTrainedModelWrapper,
)
from rlhfkit.testing import tiny_model, tiny_model_path

pytestmark = pytest.mark.filterwarnings("ignore:no value head found")


def outputs_equal(a, b, input_ids, mask):
    a.eval(), b.eval()
    with torch.no_grad():
        la, _, va = a(input_ids, attention_mask=mask)
        lb, _, vb = b(input_ids, attention_mask=mask)
    torch.testing.assert_close(la, lb, rtol=0, atol=0)
    torch.testing.assert_close(va, vb, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_causal_shapes(name):
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path(name))
    input_ids, mask = batch(3, 9)
    logits, loss, values = model(input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids))
    assert logits.shape == (3, 9, model.config.vocab_size)
    assert values.shape == (3, 9) and values.dtype == torch.float32
    assert loss is None
    _, loss, _ = model(input_ids, attention_mask=mask, labels=input_ids)
    assert loss.ndim == 0 and torch.isfinite(loss)
    *_, cache = model(input_ids, attention_mask=mask, return_past_key_values=True)
    assert cache is not None


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_returned_cache_continues_the_sequence_without_deprecation_warnings(name):
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path(name)).eval()
    input_ids, _ = batch(2, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        *_, cache = model(input_ids[:, :6], return_past_key_values=True)
        logits, _, values = model(input_ids[:, 6:], past_key_values=cache)
        full_logits, _, full_values = model(input_ids)
    torch.testing.assert_close(logits, full_logits[:, 6:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, full_values[:, 6:], rtol=1e-5, atol=1e-5)
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_seq2seq_shapes():
    model = AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tiny_model_path("t5"))
    input_ids, mask = batch(2, 7)
    decoder_input_ids = torch.randint(5, 900, (2, 4))
    logits, _, values = model(input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids)
    assert logits.shape == (2, 4, model.config.vocab_size)
    assert values.shape == (2, 4)  # one value per decoder token


def test_value_head_is_float32_on_a_bf16_base():
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("llama"), dtype=torch.bfloat16)
    assert next(model.pretrained_model.parameters()).dtype == torch.bfloat16
    assert model.v_head.summary.weight.dtype == torch.float32
    input_ids, mask = batch()
    logits, _, values = model(input_ids, attention_mask=mask)
    assert logits.dtype == torch.bfloat16 and values.dtype == torch.float32


def test_value_equals_linear_map_of_last_hidden_state():
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model_path("gpt2"), summary_dropout_prob=0.0
    )
    input_ids, mask = batch()
    _, _, values = model(input_ids, attention_mask=mask)
    hidden = model.pretrained_model(input_ids, attention_mask=mask, output_hidden_states=True).hidden_states[
        -1
    ]
    w, b = model.v_head.summary.weight, model.v_head.summary.bias
    torch.testing.assert_close(values, hidden @ w[0] + b[0])  # values[b, t] = <h[b, t], w> + bias


def test_init_strategies():
    hidden = 128  # tiny llama
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model_path("llama"), v_head_init_strategy="normal", v_head_initializer_range=0.2
    )
    assert model.v_head.summary.bias.item() == 0.0
    assert abs(model.v_head.summary.weight.std().item() - 0.2) < 0.05  # 128 draws from N(0, 0.2^2)
    default = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("llama"))
    bound = 1 / math.sqrt(hidden)  # PyTorch Linear default: U(-1/sqrt(H), 1/sqrt(H)) for weight and bias
    assert default.v_head.summary.weight.abs().max() <= bound
    assert 0 < abs(default.v_head.summary.bias.item()) <= bound


def test_value_head_bias_is_trained():
    model = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model_path("gpt2"), summary_dropout_prob=0.0
    )
    assert model.v_head.summary.bias.requires_grad
    before = model.v_head.summary.bias.detach().clone()
    optimizer = torch.optim.SGD(model.v_head.parameters(), lr=0.1)
    input_ids, mask = batch()
    _, _, values = model(input_ids, attention_mask=mask)
    ((values - 1.0) ** 2).mean().backward()
    assert model.v_head.summary.bias.grad.abs().item() > 0
    optimizer.step()
    assert not torch.equal(model.v_head.summary.bias, before)


def test_dropout_is_configurable():
    input_ids, mask = batch()
    no_dropout = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model_path("gpt2"), summary_dropout_prob=0.0
    )
    no_dropout.train()
    torch.testing.assert_close(
        no_dropout(input_ids, attention_mask=mask)[2], no_dropout(input_ids, attention_mask=mask)[2]
    )
    dropout = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model_path("gpt2"), summary_dropout_prob=0.5
    )
    assert dropout.v_head.dropout.p == 0.5
    dropout.train()
    assert not torch.equal(
        dropout(input_ids, attention_mask=mask)[2], dropout(input_ids, attention_mask=mask)[2]
    )
    dropout.eval()
    torch.testing.assert_close(
        dropout(input_ids, attention_mask=mask)[2], dropout(input_ids, attention_mask=mask)[2]
    )


def trained_copy(model):
    """Move every trainable weight a little so a round trip cannot pass by re-initialising."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.01)
    return model


def test_full_round_trip_and_plain_transformers_load(tmp_path):
    model = trained_copy(AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("llama")))
    model.save_pretrained(tmp_path)
    assert (tmp_path / VALUE_HEAD_FILE).is_file() and (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    input_ids, mask = batch()
    outputs_equal(model, loaded, input_ids, mask)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids, attention_mask=mask).logits, loaded(input_ids, attention_mask=mask)[0]
        )


def test_sharded_round_trip(tmp_path):
    model = trained_copy(AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2")))
    model.save_pretrained(tmp_path, max_shard_size="300KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    outputs_equal(model, loaded, *batch())


def test_peft_round_trip_saves_adapter_and_value_head_only(tmp_path, llama_path):
    model = AutoModelForCausalLMWithValueHead.from_pretrained(llama_path, peft_config=policy_lora())
    trained_copy(model)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    files = {p.name for p in tmp_path.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", VALUE_HEAD_FILE} <= files
    assert not any(f.startswith("model") for f in files)  # no base weights
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    assert loaded.is_peft_model and "reference" not in loaded.pretrained_model.peft_config
    outputs_equal(model, loaded, *batch())
    trainable = [n for n, p in loaded.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("v_head.") for n in trainable)


def test_missing_value_head_warns_and_initialises(tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no value head found"):
        model = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    assert model.v_head.summary.weight.shape == (1, 128)


def test_value_head_inside_model_weights_is_loaded(tmp_path):
    """Checkpoints that keep `v_head.*` keys in model.safetensors (TRL's layout) load their head."""
    model = trained_copy(AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2")))
    model.save_pretrained(tmp_path)
    (tmp_path / VALUE_HEAD_FILE).unlink()
    weights = load_file(tmp_path / "model.safetensors")
    weights.update({f"v_head.{k}": v.contiguous() for k, v in model.v_head.state_dict().items()})
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.v_head.summary.weight, model.v_head.summary.weight, rtol=0, atol=0)


def test_state_dict_is_flat_and_loads_back():
    model = trained_copy(AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2")))
    state = model.state_dict()
    assert "v_head.summary.bias" in state and "transformer.wte.weight" in state
    assert not any(k.startswith("pretrained_model.") for k in state)
    fresh = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2"))
    fresh.load_state_dict(state)
    outputs_equal(model, fresh, *batch())


def test_wraps_built_models_and_passes_through():
    base = tiny_model("gpt2")
    model = AutoModelForCausalLMWithValueHead(base, summary_dropout_prob=0.0)
    assert model.config is base.config
    input_ids, mask = batch(2, 5)
    out = model.generate(input_ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=1)
    torch.testing.assert_close(
        out, base.generate(input_ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=1)
    )
    model.gradient_checkpointing_enable()
    assert base.is_gradient_checkpointing
    model.gradient_checkpointing_disable()
    wrapped = AutoModelForCausalLMWithValueHead.from_pretrained(
        tiny_model("llama"), peft_config=policy_lora()
    )
    assert wrapped.is_peft_model


def test_push_to_hub_passes_through(monkeypatch):
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_model_path("gpt2"))
    calls = []
    monkeypatch.setattr(
        model.pretrained_model, "push_to_hub", lambda repo, **kw: calls.append(("base", repo, kw))
    )
    import huggingface_hub

    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_file", lambda self, **kw: calls.append(("head", kw["path_in_repo"]))
    )
    model.push_to_hub("me/model", private=True)
    assert calls == [("base", "me/model", {"private": True}), ("head", VALUE_HEAD_FILE)]


def test_bad_arguments_are_named():
    path = tiny_model_path("gpt2")
    with pytest.raises(ValueError, match="v_head_init_strategy"):
        AutoModelForCausalLMWithValueHead.from_pretrained(path, v_head_init_strategy="xavier")
    with pytest.raises(ValueError, match="summary_dropout_prob"):
        AutoModelForCausalLMWithValueHead.from_pretrained(path, summary_dropout_prob=1.5)
    with pytest.raises(ValueError, match="load_in_8bit and load_in_4bit"):
        AutoModelForCausalLMWithValueHead.from_pretrained(path, load_in_8bit=True, load_in_4bit=True)
    with pytest.raises(TypeError, match="pretrained_model_name_or_path"):
        AutoModelForCausalLMWithValueHead.from_pretrained(42)
    with pytest.raises(ValueError, match="reward_adapter"):
        AutoModelForSeq2SeqLMWithValueHead.from_pretrained(tiny_model_path("t5"), reward_adapter="x")
    assert issubclass(AutoModelForSeq2SeqLMWithValueHead, PreTrainedModelWrapper)
