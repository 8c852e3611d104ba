"""Chunked response scoring from hidden states equals `forward_response`'s full-logits path."""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.core.logprobs import entropy_from_logits
from rlhfkit.rollout import forward_response, lm_head, position_ids_from_mask
from rlhfkit.rollout.lm_head import chunked_response_outputs, find_lm_head
from rlhfkit.testing import tiny_model_path, tiny_value_head_model

TEMPERATURE = 0.7


def _batch(vocab_size: int):
    g = torch.Generator().manual_seed(0)
    query_ids = torch.randint(3, vocab_size, (3, 5), generator=g)
    query_mask = torch.ones(3, 5, dtype=torch.long)
    query_mask[1, :2] = 0  # left padding
    responses = torch.randint(3, vocab_size, (3, 6), generator=g)
    response_mask = torch.ones(3, 6, dtype=torch.bool)
    response_mask[2, 4:] = False  # right padding
    return query_ids, query_mask, responses, response_mask


def _chunked(model, query_ids, query_mask, responses, response_mask, **kwargs):
    """The wiring `forward_response` would use for a causal LM."""
    input_ids = torch.cat([query_ids, responses], dim=1)
    attention_mask = torch.cat([query_mask.long(), response_mask.long()], dim=1)
    position_ids = position_ids_from_mask(attention_mask)
    return chunked_response_outputs(model, input_ids, attention_mask, position_ids, responses, **kwargs)


def _assert_matches_forward_response(model, with_values=False):
    """Values and gradients (w.r.t. every trainable parameter) of both paths agree on real tokens."""
    model.eval()  # no dropout: both passes must see the same network
    batch = _batch(model.config.vocab_size)
    mask = batch[3].float()
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(3, 6, generator=g) for _ in range(3))
    params = [p for p in model.parameters() if p.requires_grad]

    def loss(logprobs, values, entropy):
        total = a * logprobs + b * entropy + (c * values if with_values else 0)
        return (total * mask).sum()

    # return_logits=True keeps forward_response on its full-logits path, also once it is wired to the
    # chunked one
    ref = forward_response(
        model, *batch, temperature=TEMPERATURE, with_values=with_values, with_entropy=True, return_logits=True
    )
    # forward_response's entropy is a statistic (detached): differentiate the straightforward one instead
    ref_entropy = entropy_from_logits(ref.logits)
    torch.testing.assert_close(ref_entropy, ref.entropy)
    ref_grads = torch.autograd.grad(loss(ref.logprobs, ref.values, ref_entropy), params)
    out = _chunked(
        model, *batch, temperature=TEMPERATURE, with_values=with_values, with_entropy=True, chunk_rows=4
    )
    assert out is not None, "expected the chunked path, not a fallback"
    logprobs, values, entropy = out
    assert logprobs.shape == entropy.shape == (3, 6) and logprobs.dtype == torch.float32
    grads = torch.autograd.grad(loss(logprobs, values, entropy), params)

    real = batch[3]
    torch.testing.assert_close(logprobs[real], ref.logprobs[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[real], ref.entropy[real], rtol=1e-5, atol=1e-5)
    if with_values:
        torch.testing.assert_close(values[real], ref.values[real], rtol=1e-5, atol=1e-5)
    else:
        assert values is None
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("arch", "tied"), [("gpt2", True), ("llama", False), ("qwen2", True)])
def test_plain_models_match_forward_response(arch, tied):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(arch))
    head = find_lm_head(model)
    assert head is not None and head.logit_scale == 1.0
    assert (head.weight is model.get_input_embeddings().weight) == tied
    _assert_matches_forward_response(model)


def test_value_head_model_matches_forward_response():
    _assert_matches_forward_response(tiny_value_head_model("llama"), with_values=True)


def test_lora_peft_model_matches_forward_response():
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    # non-zero LoRA weights, so the adapter changes the hidden states the head sees
    model = get_peft_model(
        base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    assert find_lm_head(model).weight is base.lm_head.weight
    _assert_matches_forward_response(model)


def test_scaled_logits_fold_into_temperature():
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, logits_scaling=4.0, tie_word_embeddings=False,
    )  # fmt: skip
    model = GraniteForCausalLM(config)
    assert find_lm_head(model).logit_scale == 0.25  # Granite divides its logits by logits_scaling
    _assert_matches_forward_response(model)


def test_ddp_wrapped_model_matches_forward_response():
    """DDP's own forward runs (so its gradient hooks fire); one process here, more in tests/distributed."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = DistributedDataParallel(AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")))
        model.config = model.module.config  # the test helper reads vocab_size from it
        assert find_lm_head(model).weight is model.module.lm_head.weight
        _assert_matches_forward_response(model)
    finally:
        dist.destroy_process_group()


class _ScaledHead(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, hidden):
        return self.linear(hidden) * 2.0


def test_unsupported_heads_fall_back_and_log_once(caplog, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma2Config, Gemma2ForCausalLM

    custom = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    custom.lm_head = _ScaledHead(custom.lm_head)
    lora_head = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")),
        LoraConfig(r=2, target_modules=["lm_head"]),
    )
    softcapped = Gemma2ForCausalLM(Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, final_logit_softcapping=30.0,
    ))  # fmt: skip
    monkeypatch.setattr(lm_head, "_logged_fallbacks", set())  # earlier tests may have logged these
    compiled = torch.compile(AutoModelForCausalLM.from_pretrained(tiny_model_path("gpt2")))  # compiles lazily
    expected = {
        custom: "_ScaledHead",
        lora_head: "not a plain torch.nn.Linear",
        softcapped: "not known",
        compiled: "torch.compile",
    }
    for model, reason in expected.items():
        with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.lm_head"):
            caplog.clear()
            assert find_lm_head(model) is None
            assert _chunked(model, *_batch(64)) is None
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1 and reason in messages[0], messages
    # the custom head's reason was logged the first time only
    with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.lm_head"):
        caplog.clear()
        find_lm_head(custom)
    assert not caplog.records


def test_bad_arguments_raise_before_the_forward():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path("gpt2"))
    query_ids, query_mask, responses, response_mask = _batch(64)
    with pytest.raises(ValueError, match="temperature"):
        _chunked(model, query_ids, query_mask, responses, response_mask, temperature=0.0)
    with pytest.raises(ValueError, match="input_ids"):
        chunked_response_outputs(model, responses, response_mask.long(), response_mask.long(), responses)


def test_prefers_chunked_head_above_the_threshold_through_wrappers(monkeypatch):
    from rlhfkit.rollout import scoring

    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 1000)
    model = torch.nn.Module()
    model.config = SimpleNamespace(vocab_size=100)
    wrapper = torch.nn.Module()
    wrapper.module = model  # DDP-style: the vocabulary is found on the wrapped model
    assert not scoring.prefers_chunked_head(model, 10)  # 1,000 logits: not more than the threshold
    assert scoring.prefers_chunked_head(model, 11) and scoring.prefers_chunked_head(wrapper, 11)
    assert not scoring.prefers_chunked_head(wrapper, 10)
    assert scoring.prefers_chunked_head(torch.nn.Linear(2, 2), 1)  # vocabulary unknown: the chunked path


def test_forward_response_takes_the_chunked_path_for_large_logits(monkeypatch):
    from rlhfkit.rollout import scoring

    model = tiny_value_head_model("llama", summary_dropout_prob=0.0).eval()
    batch = _batch(model.config.vocab_size)
    # packed=False: this is the padded batch's chunked path (packed rows have their own,
    # tests/rollout/test_packing.py)
    full = forward_response(
        model, *batch, with_values=True, with_entropy=True, packed=False
    )  # small: full logits
    calls = []
    original = scoring.chunked_response_outputs
    monkeypatch.setattr(
        scoring, "chunked_response_outputs", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    assert forward_response(model, *batch, with_values=True, packed=False).logprobs is not None and not calls
    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)  # now 18 tokens x vocab is "large"
    lean = forward_response(model, *batch, with_values=True, with_entropy=True, packed=False)
    assert calls == [1]
    real = batch[3]
    for a, b in ((lean.logprobs, full.logprobs), (lean.values, full.values), (lean.entropy, full.entropy)):
        torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)
    assert not lean.entropy.requires_grad


def test_training_passes_hand_the_heap_back_before_backward(monkeypatch):
    # a differentiated pass trims with the size of the (N, V) float32 logits it avoided; scoring passes do not
    trims = []
    monkeypatch.setattr(lm_head, "trim_heap", lambda nbytes: trims.append(nbytes))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        _chunked(model, *batch)
    assert trims == []
    logprobs, _, _ = _chunked(model, *batch)
    assert trims == [3 * 6 * model.config.vocab_size * 4]
    labels = torch.cat([batch[0], batch[2]], dim=1)
    lm_head.chunked_label_logprobs(model, labels, input_ids=labels)
    assert len(trims) == 2 and trims[1] == labels[:, 1:].numel() * model.config.vocab_size * 4


def test_a_frozen_bfloat16_reference_reaches_its_head_contiguous():
    # torch's CPU linear expands a frozen weight per row for a strided (B, 1, H) input (a (B, H, V) copy),
    # so the one position the model's own head projects is made contiguous first
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")).to(torch.bfloat16)
    model.requires_grad_(False).eval()
    seen = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].is_contiguous()))
    query_ids, query_mask, responses, response_mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        chunked = chunked_response_outputs(
            model, torch.cat([query_ids, responses], 1), torch.cat([query_mask, response_mask.long()], 1),
            position_ids_from_mask(torch.cat([query_mask, response_mask.long()], 1)), responses,
        )  # fmt: skip
        full = forward_response(model, query_ids, query_mask, responses, response_mask, return_logits=True)
    assert seen[0] is True
    mask = response_mask
    torch.testing.assert_close(chunked[0][mask], full.logprobs[mask], rtol=0, atol=2e-2)
