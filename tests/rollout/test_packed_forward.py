"""Padding-free (packed) scoring equals `forward_response`'s padded computation, and rows stay apart."""

from __future__ import annotations

import logging

import pytest
import torch

from rlhfkit.core.logprobs import entropy_from_logits
from rlhfkit.rollout import forward_response, packing, scoring
from rlhfkit.rollout.packing import pack_rows, packing_supported
from rlhfkit.testing import tiny_model, tiny_value_head_model

TEMPERATURE = 0.7
QUERY_LENGTHS = (6, 2, 4, 1)  # left-padded to 6
RESPONSE_LENGTHS = (12, 1, 7, 3)  # right-padded to 12


def _batch(vocab_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows, length_q, length_r = len(QUERY_LENGTHS), max(QUERY_LENGTHS), max(RESPONSE_LENGTHS)
    query_ids = torch.randint(3, vocab_size, (rows, length_q), generator=g)
    responses = torch.randint(3, vocab_size, (rows, length_r), generator=g)
    query_mask = torch.tensor([[0] * (length_q - n) + [1] * n for n in QUERY_LENGTHS])
    response_mask = torch.tensor([[True] * n + [False] * (length_r - n) for n in RESPONSE_LENGTHS])
    return query_ids, query_mask, responses, response_mask


@pytest.fixture
def pack_calls(monkeypatch):
    """Counts the batches `forward_response` packs."""
    calls = []
    original = packing.pack_rows
    monkeypatch.setattr(packing, "pack_rows", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def _assert_packed_matches_padded(model, pack_calls, with_values=False, chunked=False):
    """Values and gradients (w.r.t. every trainable parameter) of packed and padded passes agree on real
    tokens."""
    model.eval()
    batch = _batch(model.config.vocab_size)
    real = batch[3]
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(real.shape, generator=g) for _ in range(3))
    params = [p for p in model.parameters() if p.requires_grad]

    def run(packed):
        # full logits: entropy differentiated from them; chunked: entropy is a (detached) statistic
        out = forward_response(
            model,
            *batch,
            temperature=TEMPERATURE,
            with_values=with_values,
            with_entropy=True,
            return_logits=not chunked,
            packed=packed,
        )
        entropy = out.entropy if chunked else entropy_from_logits(out.logits)
        total = a * out.logprobs + b * entropy + (c * out.values if with_values else 0)
        return out, entropy, torch.autograd.grad((total * real).sum(), params)

    padded, padded_entropy, padded_grads = run(False)
    assert not pack_calls
    out, entropy, grads = run(True)
    assert pack_calls == [1]
    assert out.logprobs.shape == out.entropy.shape == real.shape
    torch.testing.assert_close(out.logprobs[real], padded.logprobs[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[real], padded_entropy[real], rtol=1e-5, atol=1e-5)
    if with_values:
        torch.testing.assert_close(out.values[real], padded.values[real], rtol=1e-5, atol=1e-5)
    if not chunked:
        assert out.logits.shape == padded.logits.shape
        torch.testing.assert_close(out.logits[real], padded.logits[real], rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, padded_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("arch", "attention"), [("gpt2", "sdpa"), ("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa")]
)
def test_plain_models_match_padded(arch, attention, pack_calls):
    _assert_packed_matches_padded(tiny_model(arch, attn_implementation=attention), pack_calls)


def test_value_head_model_matches_padded(pack_calls):
    _assert_packed_matches_padded(tiny_value_head_model("qwen2"), pack_calls, with_values=True)


def test_lora_peft_model_matches_padded(pack_calls):
    from peft import LoraConfig, get_peft_model

    # non-zero LoRA weights, so the adapter changes the hidden states
    model = get_peft_model(
        tiny_model("llama"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    _assert_packed_matches_padded(model, pack_calls)


def test_packed_rows_combine_with_the_chunked_path(monkeypatch, pack_calls):
    monkeypatch.setattr(scoring, "CHUNKED_HEAD_MIN_LOGITS", 8)  # every batch now takes the chunked head
    calls = []
    original = scoring.packed_chunked_outputs
    monkeypatch.setattr(
        scoring, "packed_chunked_outputs", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    _assert_packed_matches_padded(tiny_value_head_model("gpt2"), pack_calls, with_values=True, chunked=True)
    assert calls == [1]


def test_lora_on_the_head_uses_full_logits_over_packed_rows(pack_calls):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_model("llama"), LoraConfig(r=2, target_modules=["lm_head", "q_proj"], init_lora_weights=False)
    )
    _assert_packed_matches_padded(model, pack_calls)


def test_pack_rows_layout():
    # real lengths 4, 2, 3 and 1 tokens; packed rows hold at most the padded 5 (first-fit decreasing)
    query_ids = torch.tensor([[0, 5, 6], [0, 0, 7], [0, 8, 9], [0, 0, 4]])
    responses = torch.tensor([[10, 11], [12, 0], [13, 0], [0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 1, 1, 0], [0, 0, 1, 0, 0]])
    input_ids = torch.cat([query_ids, responses], dim=1)
    rows = pack_rows(input_ids, mask, scoring.position_ids_from_mask(mask), length_r=2)
    assert rows.input_ids.tolist() == [[5, 6, 10, 11, 4], [8, 9, 13, 7, 12]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    # 10 is predicted from 6 (flat position 1), 11 from 10 (2); 12 from 7 (8); 13 from 9 (6);
    # pad columns read junk
    assert rows.index[:, 0].tolist() == [1, 8, 6, 4]
    assert rows.index[:, 1].tolist() == [2, 9, 7, 4]


def test_no_attention_across_rows(pack_calls):
    model = tiny_model("llama").eval()
    query_ids, query_mask, responses, response_mask = _batch(model.config.vocab_size)
    attention_mask = torch.cat([query_mask, response_mask.long()], dim=1)
    rows = pack_rows(
        torch.cat([query_ids, responses], dim=1),
        attention_mask,
        scoring.position_ids_from_mask(attention_mask),
        responses.shape[1],
    )
    # rows 2, 3 and 1 (11, 4 and 3 tokens) share the second packed row, in that order
    assert rows.input_ids.shape == (2, 18) and (rows.index[1:] // 18 == 1).all()
    before = forward_response(model, query_ids, query_mask, responses, response_mask, packed=True).logprobs
    query_ids, responses = query_ids.clone(), responses.clone()
    query_ids[2, -1] = (query_ids[2, -1] + 1) % model.config.vocab_size
    responses[2, 0] = (responses[2, 0] + 1) % model.config.vocab_size
    after = forward_response(model, query_ids, query_mask, responses, response_mask, packed=True).logprobs
    assert pack_calls == [1, 1]
    assert not torch.allclose(after[2][response_mask[2]], before[2][response_mask[2]])
    for row in (0, 1, 3):
        real = response_mask[row]
        torch.testing.assert_close(after[row][real], before[row][real], rtol=0, atol=1e-6)


def test_automatic_switch_packs_when_it_saves_tokens(pack_calls):
    model = tiny_model("gpt2").eval()
    query_ids, query_mask, responses, response_mask = _batch(model.config.vocab_size)
    forward_response(model, query_ids, query_mask, responses, response_mask)
    assert pack_calls == [1]  # 4 rows of 18 columns -> 2 packed rows
    forward_response(model, query_ids, torch.ones_like(query_mask), responses, torch.ones_like(response_mask))
    assert pack_calls == [1, 1]  # packed, found to save nothing, and scored padded
    scoring_calls = []
    original = scoring.packed_logits_and_values
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            scoring, "packed_logits_and_values", lambda *a, **k: scoring_calls.append(1) or original(*a, **k)
        )
        forward_response(model, query_ids, query_mask, responses, response_mask)
        forward_response(
            model, query_ids, torch.ones_like(query_mask), responses, torch.ones_like(response_mask)
        )
    assert scoring_calls == [1]


def test_unsupported_models_fall_back_and_log_once(caplog, monkeypatch, pack_calls):
    from transformers import MistralConfig, MistralForCausalLM

    monkeypatch.setattr(packing, "_logged_fallbacks", set())
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2,
    )).eval()  # fmt: skip
    batch = _batch(64)
    with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.packing"):
        out = forward_response(mistral, *batch, packed=True)
        forward_response(mistral, *batch, packed=True)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "'mistral'" in messages[0], messages
    assert not pack_calls
    real = batch[3]
    torch.testing.assert_close(
        out.logprobs[real], forward_response(mistral, *batch, packed=False).logprobs[real]
    )
    # a backend whose kernel is not built from masking_utils' mask: not packed (checked without running it)
    flash = tiny_model("llama")
    flash.config._attn_implementation = "flash_attention_2"
    with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.packing"):
        caplog.clear()
        assert not packing_supported(flash)
    assert "flash_attention_2" in caplog.records[0].getMessage()
