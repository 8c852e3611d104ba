"""Reference models: independent frozen copies, truly shared layers, and adapter-based references."""

from __future__ import annotations

import pytest
import torch
from model_helpers import batch, policy_lora
from torch import nn

from rlhfkit.models.reference import (
    AdapterReference,
    count_shared_parameters,
    create_reference_model,
    reference_context,
    shared_parameter_names,
    unique_parameter_bytes,
)
from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead, AutoModelForSeq2SeqLMWithValueHead
from rlhfkit.testing import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore:no value head found")


def logits_of(model, input_ids, mask):
    with torch.no_grad():
        out = model(input_ids, attention_mask=mask)
    return out[0] if isinstance(out, tuple) else out.logits


def test_full_copy_is_frozen_and_independent():
    model = AutoModelForCausalLMWithValueHead(tiny_model("gpt2"))
    ref = create_reference_model(model)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in model.parameters())  # the policy is untouched
    assert count_shared_parameters(model, ref) == 0
    input_ids, mask = batch()
    before = logits_of(ref, input_ids, mask)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    torch.testing.assert_close(logits_of(ref, input_ids, mask), before, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "first_shared", "first_unshared"),
    [
        ("gpt2", "transformer.h.0.", "transformer.h.1."),
        ("llama", "model.layers.0.", "model.layers.1."),
        ("qwen2", "model.layers.0.", "model.layers.1."),
    ],
)
def test_shared_layers_are_the_same_tensors_and_frozen(name, first_shared, first_unshared):
    model = AutoModelForCausalLMWithValueHead(tiny_model(name), summary_dropout_prob=0.0)
    ref = create_reference_model(model, num_shared_layers=1)
    policy_params = dict(model.named_parameters())
    ref_params = dict(ref.named_parameters())
    shared = shared_parameter_names(model, 1)
    assert any(first_shared in n for n in shared) and not any(first_unshared in n for n in shared)
    assert any("embed" in n or "wte" in n for n in shared)  # embeddings come before layer 0
    for n, p in policy_params.items():
        is_shared = n in shared
        assert (p.data_ptr() == ref_params[n].data_ptr()) == is_shared, n
        assert p.requires_grad == (not is_shared), n

    # no gradient reaches the shared layers; the others get one
    input_ids, mask = batch()
    logits, _, values = model(input_ids, attention_mask=mask)
    (logits.logsumexp(-1).mean() + values.mean()).backward()
    for n, p in policy_params.items():
        assert (p.grad is None) == (n in shared), n

    # memory: the pair costs one policy plus only the unshared part of the reference
    shared_bytes = sum(policy_params[n].numel() * policy_params[n].element_size() for n in shared)
    assert count_shared_parameters(model, ref) == sum(policy_params[n].numel() for n in shared)
    assert unique_parameter_bytes(model, ref) == 2 * unique_parameter_bytes(model) - shared_bytes

    # an optimiser step on the policy leaves the reference's unshared layers alone
    before = logits_of(ref, input_ids, mask)
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0).step()
    torch.testing.assert_close(logits_of(ref, input_ids, mask), before, rtol=0, atol=0)


def test_t5_shares_encoder_blocks():
    model = AutoModelForSeq2SeqLMWithValueHead(tiny_model("t5"))
    ref = create_reference_model(model, num_shared_layers=1)
    shared = shared_parameter_names(model, 1)
    assert any("encoder.block.0." in n for n in shared)
    assert not any("encoder.block.1." in n or "decoder." in n for n in shared)
    assert count_shared_parameters(model, ref) == sum(
        p.numel() for n, p in model.named_parameters() if n in shared
    )


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.out = nn.Linear(4, 10)


def test_custom_pattern_and_clear_errors():
    model = Custom()
    with pytest.raises(ValueError, match="pattern="):  # unknown architecture: the error names `pattern`
        create_reference_model(model, num_shared_layers=1)
    ref = create_reference_model(model, num_shared_layers=2, pattern="blocks.{layer}")
    assert ref.embed.weight is model.embed.weight and ref.blocks[1].weight is model.blocks[1].weight
    assert ref.blocks[2].weight is not model.blocks[2].weight and ref.out.weight is not model.out.weight
    with pytest.raises(ValueError, match="only 3 layers"):
        create_reference_model(Custom(), num_shared_layers=4, pattern="blocks.{layer}")
    with pytest.raises(ValueError, match="num_shared_layers must be a positive integer"):
        create_reference_model(Custom(), num_shared_layers=0, pattern="blocks.{layer}")
    with pytest.raises(ValueError, match="exactly once"):
        create_reference_model(Custom(), num_shared_layers=1, pattern="blocks")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        create_reference_model("gpt2")


def test_peft_reference_is_the_base_without_a_copy():
    base = tiny_model("llama")
    input_ids, mask = batch()
    base_logits = logits_of(base, input_ids, mask)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base, peft_config=policy_lora())
    with torch.no_grad():  # make the adapter matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    assert not torch.allclose(logits_of(model, input_ids, mask), base_logits)
    with pytest.warns(UserWarning, match="ignored for a PEFT model"):
        ref = create_reference_model(model, num_shared_layers=1)
    assert isinstance(ref, AdapterReference) and len(list(ref.parameters())) == 0
    torch.testing.assert_close(logits_of(ref, input_ids, mask), base_logits)
    with reference_context(model) as acting:
        assert not torch.is_grad_enabled()
        torch.testing.assert_close(logits_of(acting, input_ids, mask), base_logits)
    assert not torch.allclose(logits_of(model, input_ids, mask), base_logits)  # adapter back on


def test_reference_context_needs_a_reference():
    model = AutoModelForCausalLMWithValueHead(tiny_model("gpt2"))
    with pytest.raises(ValueError, match="ref_model=create_reference_model"):
        with reference_context(model):
            pass
    ref = create_reference_model(model)
    with reference_context(model, ref_model=ref) as acting:
        assert acting is ref


def test_sft_lora_policy_keeps_the_sft_model_as_reference(sft_adapter_dir, llama_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    input_ids, mask = batch()
    sft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama_path), sft_adapter_dir)
    sft_logits = logits_of(sft.merge_and_unload(), input_ids, mask)
    base_logits = logits_of(AutoModelForCausalLM.from_pretrained(llama_path), input_ids, mask)
    assert not torch.allclose(sft_logits, base_logits, atol=1e-4)

    model = AutoModelForCausalLMWithValueHead.from_pretrained(sft_adapter_dir, summary_dropout_prob=0.0)
    peft_model = model.pretrained_model
    assert set(peft_model.peft_config) == {"default", "reference"} and peft_model.active_adapter == "default"
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".reference." in n)
    assert all(p.requires_grad for n, p in model.named_parameters() if ".default." in n)
    torch.testing.assert_close(logits_of(model, input_ids, mask), sft_logits, atol=1e-5, rtol=1e-5)

    # train the policy adapter one step: the reference stays the SFT model
    logits, _, _ = model(input_ids, attention_mask=mask)
    logits.logsumexp(-1).mean().backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0).step()
    assert not torch.allclose(logits_of(model, input_ids, mask), sft_logits, atol=1e-4)
    with reference_context(model) as acting:
        torch.testing.assert_close(logits_of(acting, input_ids, mask), sft_logits, atol=1e-5, rtol=1e-5)
    assert peft_model.active_adapter == "default"

    # the saved run keeps its reference adapter: resuming does not turn the trained policy into the reference
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(tmp_path, summary_dropout_prob=0.0)
    torch.testing.assert_close(logits_of(loaded, input_ids, mask), logits_of(model, input_ids, mask))
    torch.testing.assert_close(
        logits_of(create_reference_model(loaded), input_ids, mask), sft_logits, atol=1e-5, rtol=1e-5
    )
    with pytest.raises(ValueError, match="merge_and_unload"):
        AutoModelForCausalLMWithValueHead.from_pretrained(sft_adapter_dir, peft_config=policy_lora())
