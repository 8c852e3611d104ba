"""Checks of an inference-engine `GenerationBackend` (the vLLM server's, the colocated one), for their tests.

Both engines promise the same contract, so their tests share these: three fixed prompts, a seeded
sample at `TEMPERATURE`, the trainer's own logprobs of what was sampled (an independent forward pass, one
row at a time, no padding), and the engine's logprobs held to them within `TOLERANCE`.
"""

from __future__ import annotations

import torch

from rlhfkit.rollout import SamplingParams, pad_left

TEMPERATURE = 0.7
# the engine computes in float32 too, with its own kernels: agreement to float rounding
TOLERANCE = dict(rtol=0, atol=2e-4)


def engine_prompts(pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of different lengths: (query_ids, query_mask)."""
    return pad_left(
        [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14])], pad_id
    )


def sample(backend, pad_id: int, seed: int = 0, max_new_tokens: int = 8):
    """(query_ids, query_mask, output) of one seeded call on `engine_prompts`, with logprobs."""
    query_ids, query_mask = engine_prompts(pad_id)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=TEMPERATURE, top_k=0)
    torch.manual_seed(seed)
    out = backend.generate(query_ids, query_mask, params, logprob_temperature=TEMPERATURE)
    return query_ids, query_mask, out


def trainer_logprobs(model, query_ids, query_mask, out) -> torch.Tensor:
    """(B, R) logprob of each completion token under softmax(logits / TEMPERATURE), one row at a time."""
    rows = torch.zeros(out.responses.shape)
    with torch.no_grad():
        for i in range(len(query_ids)):
            prompt = query_ids[i][query_mask[i].bool()]
            completion = out.responses[i][out.response_mask[i]]
            logits = model(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]
            chosen = (logits / TEMPERATURE).log_softmax(-1).gather(-1, completion[:, None])[:, 0]
            rows[i, : len(completion)] = chosen
    return rows


def logprob_gap(backend, model, pad_id: int) -> float:
    """Largest |engine logprob - trainer logprob| over the tokens of one sampled batch."""
    query_ids, query_mask, out = sample(backend, pad_id)
    trainer = trainer_logprobs(model, query_ids, query_mask, out)
    return float((out.logprobs - trainer)[out.response_mask].abs().max())


def assert_engine_matches(backend, model, pad_id: int) -> None:
    """The engine's logprobs of a fresh sample equal `model`'s within `TOLERANCE`."""
    query_ids, query_mask, out = sample(backend, pad_id)
    trainer = trainer_logprobs(model, query_ids, query_mask, out)
    torch.testing.assert_close(out.logprobs[out.response_mask], trainer[out.response_mask], **TOLERANCE)


def assert_seeded_and_varied(backend, pad_id: int) -> None:
    """A seeded call samples the same again, another seed does not, and rows repeating one prompt differ."""
    first, second = sample(backend, pad_id, seed=3)[2], sample(backend, pad_id, seed=3)[2]
    assert torch.equal(first.responses, second.responses)
    assert not torch.equal(first.responses, sample(backend, pad_id, seed=4)[2].responses)
    prompt = torch.tensor([[5, 6, 7]] * 2)  # a group: one prompt, two completions
    out = backend.generate(prompt, torch.ones_like(prompt), SamplingParams(max_new_tokens=8, top_k=0))
    assert not torch.equal(out.responses[0], out.responses[1])


def assert_stops_and_padding(backend, pad_id: int) -> None:
    """Completions are right-padded with `pad_id` and end at their first stop token, which is kept."""
    query_ids, query_mask = engine_prompts(pad_id)
    stops = tuple(range(2, 400))  # ~40% of the vocabulary: most rows stop early
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=0, stop_token_ids=stops)
    out = backend.generate(query_ids, query_mask, params)
    assert out.responses.shape == out.response_mask.shape == (3, 12) and out.logprobs is None
    for ids, mask in zip(out.responses, out.response_mask):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # real tokens first, then padding
        assert (ids[n:] == pad_id).all()
        is_stop = torch.tensor([int(t) in stops for t in ids[:n]])
        assert not is_stop[:-1].any()  # nothing sampled after a stop token
        assert n == 12 or is_stop[-1]  # a short row ends with its stop token, which is kept
    assert (out.response_mask.sum(1) < 12).any()


def assert_processed_logprobs_reported(backend, model, pad_id: int) -> None:
    """The output says when its logprobs are of a truncated distribution: top-k raises every sampled token's
    logprob above the trainer's (the same mass spread over fewer tokens); without top-k they are equal."""
    query_ids, query_mask = engine_prompts(pad_id)
    full = sample(backend, pad_id)[2]
    assert not full.logprobs_processed
    torch.manual_seed(0)
    params = SamplingParams(max_new_tokens=8, temperature=TEMPERATURE, top_k=5)
    out = backend.generate(query_ids, query_mask, params, logprob_temperature=TEMPERATURE)
    assert out.logprobs_processed
    gap = (out.logprobs - trainer_logprobs(model, query_ids, query_mask, out))[out.response_mask]
    assert (gap > 0.1).all()  # a random tiny model puts most of its mass outside any 5 tokens
    # min_new_tokens reaches the engine only as a transformers extra, and blocks the stop token: processed
    extra = SamplingParams(max_new_tokens=4, temperature=TEMPERATURE, top_k=0, extra={"min_new_tokens": 2})
    assert backend.generate(query_ids, query_mask, extra, logprob_temperature=TEMPERATURE).logprobs_processed


REGEX = r"(yes|no) [0-9]{1,3}"  # at most 7 tokens of the tiny tokenizer (byte-level), then the stop token


def assert_completions_match_the_regex(backend, tokenizer, pad_id: int) -> None:
    """With a structured-outputs regex, every completion is a full match of `REGEX` followed by the stop
    token (eos 0); the logprobs are then of the masked distribution (processed)."""
    import re

    query_ids, query_mask = engine_prompts(pad_id)
    query_ids, query_mask = query_ids.repeat(3, 1), query_mask.repeat(3, 1)  # 9 rows
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=0)
    out = backend.generate(query_ids, query_mask, params, logprob_temperature=1.0)
    assert out.logprobs_processed
    texts = []
    for ids, mask in zip(out.responses, out.response_mask):
        completion = ids[mask].tolist()
        assert completion[-1] == 0, completion  # ended by the regex's end, not cut at max_new_tokens
        texts.append(tokenizer.decode(completion[:-1]))
    assert all(re.fullmatch(REGEX, text) for text in texts), texts
    assert len(set(texts)) > 1  # sampled, not one forced string


def assert_a_batch_past_the_step_budget_is_sampled(backend, pad_id: int) -> None:
    """128 seeded rows of 90 prompt tokens (11,520 > vLLM's 4,096 tokens a step) come back whole: a prompt
    prefilled in pieces would make vLLM rewind a CPU generator, which kills the engine."""
    rows = [torch.tensor([5 + (i + j) % 200 for j in range(90)]) for i in range(128)]
    query_ids, query_mask = pad_left(rows, pad_id)
    out = backend.generate(query_ids, query_mask, SamplingParams(max_new_tokens=4, top_k=0))
    assert out.responses.shape == (128, 4) and bool(out.response_mask.any(1).all())
