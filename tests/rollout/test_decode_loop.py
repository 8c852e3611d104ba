"""rlhfkit's decode loop against transformers `generate`: same tokens, logprobs, values and distribution."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhfkit.rollout import (
    DecodeLoopBackend,
    HFGenerationBackend,
    SamplingParams,
    decoding,
    make_generation_backend,
    pad_left,
)
from rlhfkit.rollout.decoding import DecodeSettings, process_logits, sample_inverse_cdf
from rlhfkit.testing import tiny_model_path, tiny_value_head_model
from rlhfkit.trainers.ppo.inputs import generation_config_from_kwargs

ARCHS = ["gpt2", "llama", "qwen2"]
PAD = 1


def model_of(arch: str):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(arch)).eval()


def prompts(lengths=(3, 7, 5, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    return pad_left([torch.randint(2, 900, (n,), generator=g) for n in lengths], PAD)


def both(model, params, value_head=None, logprob_temperature=0.7, seed=0, lengths=(3, 7, 5, 1)):
    """(transformers output, decode-loop output) for the same prompts and seed."""
    ids, mask = prompts(lengths)
    outs = []
    for backend in (HFGenerationBackend, DecodeLoopBackend):
        torch.manual_seed(seed)
        sampler = backend(model, PAD, value_head=value_head)
        outs.append(sampler.generate(ids, mask, params, logprob_temperature=logprob_temperature))
    return outs


def assert_same(a, b, values=False):
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(a.response_mask, b.response_mask)
    m = a.response_mask
    torch.testing.assert_close(b.logprobs[m], a.logprobs[m], atol=1e-5, rtol=1e-5)
    if values:
        torch.testing.assert_close(b.values[m], a.values[m], atol=1e-5, rtol=1e-5)


def early_stops(model, steps=10, lengths=(3, 7, 5, 1)):
    """Stop tokens that end row 0 at its 3rd token and row 2 at its 6th (greedy), the others run on."""
    ids, mask = prompts(lengths)
    greedy = (
        HFGenerationBackend(model, PAD).generate(ids, mask, SamplingParams(steps, do_sample=False)).responses
    )
    return (int(greedy[0, 2]), int(greedy[2, 5]))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_generate_with_and_without_stop_tokens(arch):
    model = model_of(arch)
    stops = early_stops(model)
    for stop_token_ids in (None, stops):
        a, b = both(model, SamplingParams(10, do_sample=False, stop_token_ids=stop_token_ids))
        assert_same(a, b)
    assert a.response_mask.sum(1).tolist()[0] <= 3 and not a.response_mask.all()  # rows did stop early


@pytest.mark.parametrize("arch", ARCHS)
def test_prompts_without_padding_run_without_a_mask_and_match_generate(arch):
    model, lengths = model_of(arch), (5, 5, 5, 5)
    params = SamplingParams(10, do_sample=False, stop_token_ids=early_stops(model, lengths=lengths))
    a, _ = both(model, params, lengths=lengths)
    masks = []
    decoding.generating_module(model).register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    b = DecodeLoopBackend(model, PAD).generate(*prompts(lengths), params, logprob_temperature=0.7)
    assert_same(a, b)
    assert not a.response_mask.all() and len(masks) > 3 and all(m is None for m in masks)


def test_a_prompt_repeated_in_a_group_is_prefilled_once_and_matches_generate():
    model = model_of("llama")
    ids, mask = prompts((3, 6))
    ids, mask = ids.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)  # two groups of 3
    widths = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    params = SamplingParams(8, do_sample=False)
    outs = [
        cls(model, PAD).generate(ids, mask, params, logprob_temperature=0.7)
        for cls in (HFGenerationBackend, DecodeLoopBackend)
    ]
    assert_same(*outs)
    responses = outs[1].responses
    assert (responses[0] == responses[2]).all() and not (responses[0] == responses[3]).all()
    assert widths[-8] == (2, 6) and widths[-7] == (
        6,
        1,
    )  # the loop's prefill: one row per prompt, then every row
    torch.manual_seed(0)
    sampled = DecodeLoopBackend(model, PAD).generate(ids, mask, SamplingParams(8, do_sample=True))
    assert not (sampled.responses[0] == sampled.responses[1]).all()  # the group's rows still sample apart


def test_greedy_matches_generate_with_a_value_head_and_repetition_penalty():
    model = tiny_value_head_model("llama", summary_dropout_prob=0.0).eval()
    params = SamplingParams(9, do_sample=False, repetition_penalty=1.3, stop_token_ids=early_stops(model))
    a, b = both(model, params, value_head=model.v_head)
    assert_same(a, b, values=True)


def test_lora_adapters_the_active_one_is_used():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        model_of("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    model.add_adapter("other", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = SamplingParams(8, do_sample=False)
    outs = {}
    for name in ("default", "other"):
        model.set_adapter(name)
        a, b = both(model, params)
        assert_same(a, b)
        outs[name] = b.responses
    assert not torch.equal(outs["default"], outs["other"])


def test_ended_rows_leave_the_batch_and_are_padded_like_generate():
    model = model_of("gpt2")
    params = SamplingParams(10, do_sample=False, stop_token_ids=early_stops(model))
    a, _ = both(model, params)
    batch_sizes = []
    model.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: batch_sizes.append(kwargs["attention_mask"].shape[0]), with_kwargs=True
    )
    b = DecodeLoopBackend(model, PAD).generate(*prompts(), params, logprob_temperature=0.7)
    assert_same(a, b)
    assert batch_sizes[0] == 4 and batch_sizes[-1] == 2  # rows 0 and 2 were cut after they ended
    assert batch_sizes == sorted(batch_sizes, reverse=True)
    assert (b.responses[0, 3:] == PAD).all() and not b.response_mask[0, 3:].any()


def test_min_new_tokens_holds_the_stop_tokens_back():
    model = model_of("qwen2")
    params = SamplingParams(
        10, do_sample=False, stop_token_ids=early_stops(model), extra={"min_new_tokens": 10}
    )
    a, b = both(model, params)
    assert_same(a, b)
    assert b.response_mask.all()


def test_sampling_with_the_seeds_settings_runs_the_loop_and_repeats_with_a_seed(caplog):
    model = model_of("llama")
    seeds_kwargs = {"min_length": -1, "top_k": 0.0, "top_p": 1.0, "do_sample": True, "max_new_tokens": 12}
    settings = SamplingParams.from_generation_config(
        generation_config_from_kwargs(model.generation_config, seeds_kwargs)
    )
    ids, mask = prompts()
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.decoding"):
            runs.append(DecodeLoopBackend(model, PAD).generate(ids, mask, settings).responses)
    assert torch.equal(runs[0], runs[1]) and not caplog.records
    torch.manual_seed(4)
    assert not torch.equal(DecodeLoopBackend(model, PAD).generate(ids, mask, settings).responses, runs[0])


def test_an_unsupported_setting_falls_back_to_generate_and_says_why(caplog, monkeypatch):
    monkeypatch.setattr(decoding, "_logged_reasons", set())  # each reason is logged once per process
    model = model_of("llama")
    params = SamplingParams(8, do_sample=True, extra={"no_repeat_ngram_size": 2})
    with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.decoding"):
        a, b = both(model, params, seed=5)
    assert torch.equal(a.responses, b.responses)  # generate drew them from the same seed
    assert any("no_repeat_ngram_size" in r.getMessage() for r in caplog.records)


def test_an_encoder_decoder_model_falls_back_to_generate(caplog, monkeypatch):
    monkeypatch.setattr(decoding, "_logged_reasons", set())
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_path("t5")).eval()
    with caplog.at_level(logging.WARNING, logger="rlhfkit.rollout.decoding"):
        a, b = both(model, SamplingParams(6, do_sample=False))
    assert_same(a, b)
    assert any("encoder-decoder" in r.getMessage() for r in caplog.records)


def test_none_settings_take_the_models_and_transformers_defaults():
    model = model_of("llama")
    config = HFGenerationBackend(model, PAD).generation_config(SamplingParams(5))
    settings = DecodeSettings.resolve(model, config)
    assert (settings.top_k, settings.top_p, settings.temperature) == (
        50,
        1.0,
        1.0,
    )  # transformers' global default
    assert settings.eos_token_ids == (model.generation_config.eos_token_id,)
    model.generation_config.top_k = 7
    assert DecodeSettings.resolve(model, config).top_k == 7


def test_a_model_built_from_a_config_runs_the_loop():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=1)  # fmt: skip
    model = LlamaForCausalLM(config).eval()  # its generation_config says output_attentions=False
    generation_config = HFGenerationBackend(model, PAD).generation_config(SamplingParams(5))
    assert isinstance(DecodeSettings.resolve(model, generation_config), DecodeSettings)


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p,penalty",
    [
        (1.0, 0, 1.0, None, 1.0),
        (0.7, 5, 1.0, None, 1.0),
        (1.3, 0, 0.8, None, 1.5),
        (0.9, 20, 0.6, 0.05, 1.2),
        (1.0, 0, 1.0, 0.1, 0.8),
    ],
)
def test_processed_logits_equal_transformers_processors(temperature, top_k, top_p, min_p, penalty):
    g = torch.Generator().manual_seed(0)
    logits, history = torch.randn(6, 40, generator=g) * 3, torch.randint(0, 40, (6, 9), generator=g)
    expected_steps = [RepetitionPenaltyLogitsProcessor(penalty), TemperatureLogitsWarper(temperature)]
    expected_steps += [TopKLogitsWarper(top_k)] if top_k else []
    expected_steps += [TopPLogitsWarper(top_p)] if top_p < 1 else []
    expected_steps += [MinPLogitsWarper(min_p)] if min_p is not None else []
    expected = LogitsProcessorList(expected_steps)(history, logits.clone())
    settings = DecodeSettings(10, True, temperature, top_k, top_p, min_p, penalty, 0, 0, ())
    seen = torch.zeros(6, 40, dtype=torch.bool).scatter(1, history, True)
    torch.testing.assert_close(process_logits(logits, settings, seen), expected)


def test_inverse_cdf_draws_follow_the_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.15, 0.01, 0.49, 0.0])
    n = 200_000
    draws = sample_inverse_cdf(probs.expand(n, -1).contiguous())
    counts = torch.bincount(draws, minlength=8).double()
    sd = (n * probs * (1 - probs)).double().sqrt()
    assert ((counts - n * probs).abs() <= 5 * sd + 1e-9).all()
    assert counts[probs == 0].sum() == 0


def test_inverse_cdf_draw_rounded_up_to_the_total_takes_the_last_possible_token(monkeypatch):
    # u == total: the search passes every token, lands on zero-probability ones (clamped to the last column);
    # the running sum reaches the total at the last token with probability > 0, so that is the draw
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0], [0.1, 0.0, 0.0, 0.6, 0.3], [0.0, 0.9, 0.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, **kw))
    assert sample_inverse_cdf(probs).tolist() == [2, 4, 1]


def test_the_factory_names_its_engines():
    model = model_of("gpt2")
    assert type(make_generation_backend(model, PAD)) is DecodeLoopBackend
    assert type(make_generation_backend(model, PAD, engine="transformers")) is HFGenerationBackend
    with pytest.raises(ValueError, match="generation_backend"):
        make_generation_backend(model, PAD, engine="vllm")
