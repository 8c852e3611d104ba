"""Rollout: padding helpers, and scoring that ignores padding and chunking
(generation: test_generation.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhfkit.core.logprobs import selective_log_softmax
from rlhfkit.rollout import (
    LengthSampler,
    eval_mode,
    forward_response,
    last_true_indices,
    pad_left,
    pad_right,
    position_ids_from_mask,
    reward_model_scores,
)
from rlhfkit.testing import tiny_model_path, tiny_tokenizer

ARCHS = ["gpt2", "llama", "qwen2"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _queries(tokenizer, texts):
    return [torch.tensor(tokenizer(t)["input_ids"]) for t in texts]


def test_pad_left_and_right_layouts():
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    ids, mask = pad_left(seqs, pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_right(seqs, pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    # per-token values keep their dtype (float logprobs are not truncated to integers)
    values, mask = pad_right([torch.tensor([-0.25, -1.5]), torch.tensor([-2.75])], pad_token_id=0)
    assert values.dtype == torch.float32 and values.tolist() == [[-0.25, -1.5], [-2.75, 0.0]]


def test_position_ids_and_last_index():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    # real tokens count 0, 1, 2 ...; padding gets 0
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
    assert last_true_indices(mask).tolist() == [4, 5]


def test_length_sampler_range_and_validation():
    sampler = LengthSampler(2, 5)
    draws = {sampler() for _ in range(200)}
    assert draws == {2, 3, 4}
    with pytest.raises(ValueError, match="min_value"):
        LengthSampler(5, 5)


@pytest.mark.parametrize("arch", ARCHS)
def test_logprobs_do_not_depend_on_padding_or_chunking(arch, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(arch)).eval()
    queries = _queries(tokenizer, ["the acting was wonderful and", "boring", "we left early because the"])
    responses_list = _queries(tokenizer, [" the end", " very slow plot that", " it"])
    responses, response_mask = pad_right(responses_list, tokenizer.pad_token_id)
    ids, mask = pad_left(queries, tokenizer.pad_token_id)
    batched = forward_response(model, ids, mask, responses, response_mask).logprobs
    with torch.no_grad():
        for i, (q, r) in enumerate(zip(queries, responses_list)):
            # unpadded, single-sequence reference computed the naive way
            full = torch.cat([q, r]).unsqueeze(0)
            logits = model(input_ids=full).logits[:, len(q) - 1 : -1]
            expected = torch.log_softmax(logits.float(), -1).gather(-1, r.view(1, -1, 1)).squeeze(-1)[0]
            torch.testing.assert_close(batched[i, : len(r)], expected, atol=1e-4, rtol=1e-4)
    # extra left padding changes nothing
    more_pad = torch.cat([torch.full((3, 4), tokenizer.pad_token_id), ids], dim=1)
    more_mask = torch.cat([torch.zeros(3, 4, dtype=torch.long), mask], dim=1)
    shifted = forward_response(model, more_pad, more_mask, responses, response_mask).logprobs
    torch.testing.assert_close(shifted[response_mask], batched[response_mask], atol=1e-4, rtol=1e-4)


def test_temperature_and_entropy(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")).eval()
    ids, mask = pad_left(_queries(tokenizer, ["a good", "the worst"]), tokenizer.pad_token_id)
    responses, response_mask = pad_right(
        _queries(tokenizer, [" movie", " film ever"]), tokenizer.pad_token_id
    )
    out = forward_response(
        model, ids, mask, responses, response_mask, temperature=0.7, with_entropy=True, return_logits=True
    )
    torch.testing.assert_close(out.logprobs, selective_log_softmax(out.logits, responses))
    probs = torch.softmax(out.logits.float(), -1)
    torch.testing.assert_close(out.entropy, -(probs * probs.log()).sum(-1), atol=1e-4, rtol=1e-4)
    plain = forward_response(model, ids, mask, responses, response_mask, return_logits=True)
    torch.testing.assert_close(out.logits, plain.logits / 0.7)


@pytest.mark.parametrize("arch", ARCHS)
def test_reward_scores_ignore_padding_side(arch, tokenizer):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path(f"{arch}-reward")).eval()
    texts = _queries(tokenizer, ["what a great film", "bad", "the music was lovely but long"])
    left_ids, left_mask = pad_left(texts, tokenizer.pad_token_id)
    right_ids, right_mask = pad_right(texts, tokenizer.pad_token_id)
    left = reward_model_scores(model, left_ids, left_mask)
    right = reward_model_scores(model, right_ids, right_mask.long())
    assert left.shape == (3,) and left.dtype == torch.float32
    torch.testing.assert_close(left, right, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        single = torch.stack([model(input_ids=t.unsqueeze(0)).logits.reshape(()) for t in texts])
    torch.testing.assert_close(left, single, atol=1e-4, rtol=1e-4)


def test_reward_scores_reject_empty_rows(tokenizer):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path("llama-reward"))
    ids = torch.tensor([[5, 6], [7, 8]])
    with pytest.raises(ValueError, match="no real token"):
        reward_model_scores(model, ids, torch.tensor([[1, 1], [0, 0]]))


def test_eval_mode_restores_each_submodules_own_mode():
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Dropout(0.5))
    model.train()
    model[1].eval()  # e.g. a frozen head deliberately kept in eval
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model[0].training
    assert not model[1].training, "a submodule that was in eval must stay in eval"


def test_forward_accepts_looks_through_peft_but_not_the_value_head():
    """PEFT passes keywords on, so a PEFT policy and its base take the same logits_to_keep path; the
    value-head wrapper needs every position's hidden state, so it is not looked through.
    (DDP: tests/distributed.)"""
    import warnings

    from peft import LoraConfig, get_peft_model

    from rlhfkit import AutoModelForCausalLMWithValueHead
    from rlhfkit.rollout.scoring import forward_accepts

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path("llama"))
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path("llama")),
        LoraConfig(r=2, target_modules=["q_proj"]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = AutoModelForCausalLMWithValueHead(peft_model)
    assert forward_accepts(base, "logits_to_keep") and forward_accepts(peft_model, "logits_to_keep")
    assert not forward_accepts(wrapped, "logits_to_keep")
    assert not forward_accepts(base, "no_such_argument")
