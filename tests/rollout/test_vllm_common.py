"""What both vLLM backends report about their logprobs, from the settings they actually send: no engine
needed (the engine-side checks are in test_vllm_server.py and colocate_cases.py)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.vllm_common import engine_request, generation_output, logprobs_processed
from rlhfkit.testing import tiny_model

PROMPTS = torch.tensor([[1, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])


def _request(model=None, **params):
    """The generate request of two prompts at temperature 0.7 (greedy: logprobs at temperature 1)."""
    model = model or tiny_model("llama")
    settings = SamplingParams(max_new_tokens=4, temperature=0.7, **params)
    temperature = 0.7 if settings.do_sample else 1.0
    return engine_request(model, 1, *PROMPTS, settings, logprob_temperature=temperature)


@pytest.mark.parametrize(
    "params, processed",
    [
        (dict(top_k=0), False),  # the full distribution at the temperature
        (dict(top_k=5), True),
        (dict(top_k=0, top_p=0.9), True),
        (dict(top_k=0, min_p=0.05), True),
        (dict(top_k=0, repetition_penalty=1.1), True),
        (dict(top_k=0, extra={"min_new_tokens": 2}), True),  # stop tokens blocked: only as an extra
        (dict(top_k=0, do_sample=False), False),  # greedy: top-k would not truncate a greedy pick's logprob
        (dict(top_k=5, do_sample=False, repetition_penalty=1.2), True),
    ],
)
def test_processed_follows_the_settings_sent(params, processed):
    assert logprobs_processed(_request(**params)) is processed


def test_the_models_generation_config_counts_not_only_the_callers_settings():
    # the caller leaves top_k unset; the model's generation_config sets it, and that is what is sent
    model = tiny_model("llama")
    model.generation_config.top_k = 20
    request = _request(model)
    assert request["top_k"] == 20 and logprobs_processed(request)


def test_a_regex_constrains_and_so_processes():
    request = {**_request(top_k=0), "regex": "(yes|no)"}
    assert logprobs_processed(request)


def test_the_output_carries_the_flag_and_pads_the_completions():
    request = _request(top_k=5)
    answer = {"completion_ids": [[9, 0], [4]], "logprobs": [[-0.5, -0.25], [-1.0]]}
    out = generation_output(answer, request, 1, torch.device("cpu"))
    assert out.logprobs_processed
    assert out.responses.tolist() == [[9, 0, 1, 1], [4, 1, 1, 1]]
    assert out.response_mask.sum(1).tolist() == [2, 1]
    assert out.logprobs[0, :2].tolist() == [-0.5, -0.25]
    unasked = generation_output({**answer, "logprobs": None}, request, 1, torch.device("cpu"))
    assert unasked.logprobs is None and not unasked.logprobs_processed  # no logprobs, nothing to judge
