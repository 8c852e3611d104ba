"""The generation backend: stop handling, masks, chunking, settings reaching `generate`, streamed logprobs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationConfig

from rlhfkit.rollout import HFGenerationBackend, SamplingParams, forward_response, pad_left
from rlhfkit.rollout.streaming import StreamedLogprobs
from rlhfkit.testing import tiny_model_path, tiny_tokenizer

ARCHS = ["gpt2", "llama", "qwen2"]
TEXTS = ["the film was", "a quiet story about", "it", "we left early because the"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def model_of(arch: str):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(arch)).eval()


def prompts(tokenizer, texts=TEXTS):
    return pad_left([torch.tensor(tokenizer(t)["input_ids"]) for t in texts], tokenizer.pad_token_id)


def spy_on_generate(model, monkeypatch) -> list[dict]:
    """Record the keyword arguments of every `model.generate` call (the call itself goes through)."""
    calls, original = [], model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_are_cut_after_the_first_stop_token(arch, tokenizer):
    model = model_of(arch)
    ids, mask = prompts(tokenizer)
    # greedy, with row 0's first token as the stop token: row 0 is cut for sure
    stop = int(model(input_ids=ids, attention_mask=mask).logits[:, -1].argmax(-1)[0])
    model.train()
    out = HFGenerationBackend(model, tokenizer.pad_token_id).generate(
        ids, mask, SamplingParams(max_new_tokens=12, do_sample=False, stop_token_ids=[stop])
    )
    assert out.responses.shape == out.response_mask.shape == (4, 12) and out.logprobs is None
    cut = 0
    for row, row_mask in zip(out.responses, out.response_mask):
        hits = (row == stop).nonzero().flatten()
        if len(hits):
            first, cut = int(hits[0]), cut + 1
            assert row_mask[: first + 1].all() and not row_mask[first + 1 :].any()
            assert (row[first + 1 :] == tokenizer.pad_token_id).all()
        else:
            assert row_mask.all()
    assert cut > 0 and out.response_mask[0].tolist() == [True] + [False] * 11
    assert model.training, "generation must restore train mode"


def test_several_stop_tokens_and_no_stop_token(tokenizer):
    model = model_of("llama")
    ids, mask = prompts(tokenizer)
    greedy = SamplingParams(max_new_tokens=8, do_sample=False)
    backend = HFGenerationBackend(model, tokenizer.pad_token_id)
    free = backend.generate(ids, mask, greedy)
    # stop at two tokens greedy decoding produces at columns 2 and 4 of rows 0 and 1
    a, b = int(free.responses[0, 2]), int(free.responses[1, 4])
    stopped = backend.generate(
        ids, mask, SamplingParams(max_new_tokens=8, do_sample=False, stop_token_ids=[a, b])
    )
    for row in range(4):
        hits = torch.isin(free.responses[row], torch.tensor([a, b])).nonzero().flatten()
        end = int(hits[0]) + 1 if len(hits) else 8
        assert stopped.response_mask[row].tolist() == [True] * end + [False] * (8 - end)
        assert torch.equal(stopped.responses[row, :end], free.responses[row, :end])
        assert (stopped.responses[row, end:] == tokenizer.pad_token_id).all()
    # without stop tokens the mask ends before the first pad token
    pad = tokenizer.pad_token_id
    first_pad = [int((r == pad).nonzero()[0]) if (r == pad).any() else 8 for r in free.responses]
    assert free.response_mask.sum(1).tolist() == first_pad


def test_chunking_equals_one_batch(tokenizer):
    model = model_of("gpt2")
    ids, mask = prompts(tokenizer)
    # 3 more pad columns: chunks drop the pad columns none of their rows needs, so nothing changes
    ids = torch.cat([torch.full((4, 3), tokenizer.pad_token_id), ids], dim=1)
    mask = torch.cat([torch.zeros(4, 3, dtype=mask.dtype), mask], dim=1)
    params = SamplingParams(max_new_tokens=6, do_sample=False, stop_token_ids=[tokenizer.eos_token_id])
    whole = HFGenerationBackend(model, tokenizer.pad_token_id).generate(
        ids, mask, params, logprob_temperature=1.0
    )
    seen = []
    chunked = HFGenerationBackend(model, tokenizer.pad_token_id, chunk_size=3, progress=seen.append).generate(
        ids, mask, params, logprob_temperature=1.0
    )
    assert seen == [3, 1]
    assert torch.equal(whole.responses, chunked.responses) and torch.equal(
        whole.response_mask, chunked.response_mask
    )
    real = whole.response_mask
    torch.testing.assert_close(whole.logprobs[real], chunked.logprobs[real], atol=1e-5, rtol=1e-5)
    # sampling under a fixed seed: the chunked call equals the same chunks sampled one after the other
    sample = SamplingParams(max_new_tokens=6, temperature=0.9, top_k=0)
    torch.manual_seed(3)
    chunked = HFGenerationBackend(model, tokenizer.pad_token_id, chunk_size=2).generate(ids, mask, sample)
    torch.manual_seed(3)
    one_by_one = [
        HFGenerationBackend(model, tokenizer.pad_token_id).generate(ids[r], mask[r], sample)
        for r in (slice(0, 2), slice(2, 4))
    ]
    assert torch.equal(chunked.responses, torch.cat([o.responses for o in one_by_one]))


def test_settings_reach_generate(tokenizer, monkeypatch):
    model = model_of("llama")
    calls = spy_on_generate(model, monkeypatch)
    ids, mask = prompts(tokenizer)
    params = SamplingParams(
        max_new_tokens=5,
        temperature=0.7,
        top_k=7,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.3,
        stop_token_ids=[5, 9],
        extra={"no_repeat_ngram_size": 2},
    )
    HFGenerationBackend(model, 3).generate(ids, mask, params)
    config = calls[0]["generation_config"]
    assert (config.max_new_tokens, config.do_sample, config.temperature, config.top_k, config.top_p) == (
        5,
        True,
        0.7,
        7,
        0.9,
    )
    assert (config.min_p, config.repetition_penalty, config.no_repeat_ngram_size) == (0.05, 1.3, 2)
    assert config.eos_token_id == [5, 9] and config.pad_token_id == 3
    # greedy decoding does not pass sampling-only settings (transformers warns about them)
    config = HFGenerationBackend(model, 3).generation_config(
        SamplingParams(max_new_tokens=2, do_sample=False, temperature=0.5, top_k=3)
    )
    assert config.do_sample is False and config.temperature is None and config.top_k is None
    with pytest.raises(ValueError, match="num_beams"):
        HFGenerationBackend(model, 3).generate(
            ids, mask, SamplingParams(max_new_tokens=2, extra={"num_beams": 2}), logprob_temperature=1.0
        )
    with pytest.raises(ValueError, match="unknown generation settings"):
        HFGenerationBackend(model, 3).generate(ids, mask, SamplingParams(max_new_tokens=2, extra={"nope": 1}))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2, "temperature": 0.0}, "temperature"),
        ({"max_new_tokens": 2, "top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 2, "top_k": -1}, "top_k"),
        ({"max_new_tokens": 2, "stop_token_ids": []}, "stop_token_ids"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_from_a_generation_config():
    config = GenerationConfig(
        max_new_tokens=4,
        do_sample=True,
        top_k=0,
        temperature=0.8,
        no_repeat_ngram_size=3,
        eos_token_id=2,
        pad_token_id=1,
    )
    params = SamplingParams.from_generation_config(config, stop_token_ids=[7])
    assert (params.max_new_tokens, params.do_sample, params.top_k, params.temperature) == (4, True, 0, 0.8)
    assert params.top_p is None and params.stop_token_ids == (7,)
    assert params.extra == {"no_repeat_ngram_size": 3}  # eos and pad are the backend's business


def raw_forward_logprobs(model, ids, mask, out, temperature):
    with torch.no_grad():
        return forward_response(
            model, ids, mask, out.responses, out.response_mask, temperature=temperature
        ).logprobs


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_streamed_logprobs_equal_a_forward_pass_and_the_output_logits_path(arch, tokenizer, monkeypatch):
    model = model_of(arch)
    ids, mask = prompts(tokenizer)
    # processors that change the sampling distribution: the logprobs still read the raw logits
    params = SamplingParams(
        max_new_tokens=7,
        temperature=0.7,
        top_k=20,
        top_p=0.95,
        repetition_penalty=1.2,
        stop_token_ids=[tokenizer.eos_token_id],
    )
    backend = HFGenerationBackend(model, tokenizer.pad_token_id, chunk_size=3)
    calls = spy_on_generate(model, monkeypatch)
    for temperature in (1.0, 0.7):
        torch.manual_seed(0)
        out = backend.generate(ids, mask, params, logprob_temperature=temperature)
        real = out.response_mask
        assert real.sum() > len(TEXTS)
        expected = raw_forward_logprobs(model, ids, mask, out, temperature)
        torch.testing.assert_close(out.logprobs[real], expected[real], atol=1e-5, rtol=1e-5)
    # memory: generate is never asked to keep per-step logits or scores, and returns bare sequences
    for call in calls:
        config = call["generation_config"]
        assert not config.output_logits and not config.output_scores and not config.return_dict_in_generate
    # the old path: the same samples' logprobs from generate's output_logits stack
    config = backend.generation_config(params)
    config.output_logits = config.return_dict_in_generate = True
    torch.manual_seed(0)
    for rows in (slice(0, 3), slice(3, 4)):  # the backend's chunks, without the pad columns they drop
        first = int(mask[rows].any(0).long().argmax())
        chunk_ids, chunk_mask = ids[rows, first:], mask[rows, first:]
        old = model.generate(input_ids=chunk_ids, attention_mask=chunk_mask, generation_config=config)
        piece = old.sequences[:, chunk_ids.shape[1] :]
        from_logits = torch.stack(
            [
                torch.log_softmax(step / 0.7, -1).gather(-1, token[:, None])[:, 0]
                for step, token in zip(old.logits, piece.T)
            ],
            dim=1,
        )
        real = out.response_mask[rows, : piece.shape[1]]
        assert torch.equal(piece[real], out.responses[rows, : piece.shape[1]][real])
        torch.testing.assert_close(
            out.logprobs[rows, : piece.shape[1]][real], from_logits[real], atol=1e-6, rtol=1e-6
        )


def test_streamed_logprobs_of_an_encoder_decoder(tokenizer):
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_path("t5")).eval()
    ids, mask = prompts(tokenizer)
    torch.manual_seed(0)
    out = HFGenerationBackend(model, tokenizer.pad_token_id).generate(
        ids, mask, SamplingParams(max_new_tokens=5, top_k=0), logprob_temperature=1.0
    )
    expected = raw_forward_logprobs(model, ids, mask, out, 1.0)
    torch.testing.assert_close(
        out.logprobs[out.response_mask], expected[out.response_mask], atol=1e-5, rtol=1e-5
    )


def test_streamed_logprobs_need_the_hook_and_a_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        StreamedLogprobs(0.0)
    with pytest.raises(RuntimeError, match="attached"):
        StreamedLogprobs()(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 5))


def test_weights_context_is_entered_once_per_call(tokenizer):
    """ZeRO-3 gathering wraps the whole call, all chunks, not each chunk or token."""
    import contextlib

    model = model_of("llama")
    ids, mask = prompts(tokenizer)
    entered = []

    @contextlib.contextmanager
    def gather():
        entered.append(len(entered))
        yield

    backend = HFGenerationBackend(model, tokenizer.pad_token_id, chunk_size=1, weights_context=gather)
    backend.generate(ids, mask, SamplingParams(max_new_tokens=2, do_sample=False))
    assert entered == [0]  # four chunks, one gathering


def test_every_backend_gets_the_prompt_checks():
    from rlhfkit.rollout import GenerationBackend
    from rlhfkit.rollout.generation import GenerationOutput

    class Echo(GenerationBackend):
        """A stand-in backend: answers every prompt with its own tokens."""

        def _sample(self, query_ids, query_mask, params, logprob_temperature):
            return GenerationOutput(query_ids, query_mask.bool())

    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="query_ids and query_mask"):
        Echo().generate(ids, mask[:, :2], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="query_ids and query_mask"):
        Echo().generate(ids[0], mask[0], SamplingParams(max_new_tokens=2))
    assert Echo().generate(ids, mask, SamplingParams(max_new_tokens=2)).responses.tolist() == [[5, 6, 7]]


def test_streamed_rows_share_one_buffer_and_keep_exact_values():
    # each step's log-softmax row is copied into the first step's block: no fresh (B, V) block per step
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(2, 7, generator=g) for _ in range(3)]
    streamed = StreamedLogprobs(0.5)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])  # sampled from steps 0, 1, 2
    prompt = torch.zeros(2, 1, dtype=torch.long)
    buffers = []
    for t, logits in enumerate(steps):
        streamed._latest = logits
        streamed(torch.cat([prompt, tokens[:, :t]], 1), logits)  # the sequence so far
        buffers.append(streamed._pending.data_ptr())
    assert len(set(buffers)) == 1
    got = streamed.finish(tokens)
    want = torch.stack([torch.log_softmax(s / 0.5, -1) for s in steps], 1).gather(-1, tokens[..., None])[
        ..., 0
    ]
    assert torch.equal(got, want)
