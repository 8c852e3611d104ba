"""`scripted_sampler`: replies chosen by the test, per row and context, with the model's own logprobs."""

from __future__ import annotations

import torch

from rlhfkit.rollout import SamplingParams, forward_response
from rlhfkit.rollout.generation import pad_left
from rlhfkit.testing import tiny_model, tiny_tokenizer
from rlhfkit.testing.scripted import scripted_sampler


def test_replies_follow_the_script_end_with_eos_and_carry_the_models_logprobs():
    tok, model = tiny_tokenizer(), tiny_model("llama")
    seen = []

    def script(context: str, row: int) -> str:
        seen.append((context, row))
        return "the film" if "story" in context else "a cast of many good actors"

    prompts = [tok.encode(text) for text in ("<|user|>\na story", "<|user|>\nwe saw")]
    query_ids, query_mask = pad_left([torch.tensor(p) for p in prompts], tok.pad_token_id)
    out = scripted_sampler(model, tok, script).generate(
        query_ids, query_mask, SamplingParams(max_new_tokens=5), logprob_temperature=1.0
    )
    assert seen == [("<|user|>\na story", 0), ("<|user|>\nwe saw", 1)]  # contexts decoded with special tokens
    first = tok.encode("the film", add_special_tokens=False) + [tok.eos_token_id]
    second = tok.encode("a cast of many good actors", add_special_tokens=False)[:5]  # cut at max_new_tokens
    assert len(first) < 5 < len(second) + 1
    assert out.responses[0, : len(first)].tolist() == first and out.response_mask[0].sum() == len(first)
    assert out.responses[1].tolist() == second and out.response_mask[1].all()
    expected = forward_response(model, query_ids, query_mask, out.responses, out.response_mask).logprobs
    torch.testing.assert_close(out.logprobs[out.response_mask], expected[out.response_mask])
