"""run_episodes: the trained ids and mask are exactly the sampled and the inserted tokens, one by one."""

from __future__ import annotations

import pytest
import torch
from scripted_backend import ScriptedBackend, ScriptedFirstTurn, char_ids, scripted_logprobs

from rlhfkit.agents import ToolBox, run_episodes
from rlhfkit.agents.turns import render_ids, tool_suffix_ids
from rlhfkit.rollout import (
    DecodeLoopBackend,
    HFGenerationBackend,
    SamplingParams,
    pad_left,
)
from rlhfkit.testing import tiny_model
from rlhfkit.testing.chat_templates import tool_chat_tokenizer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


# How each family's model writes the call multiply(a=3, b=4)
CALL_TEXT = {
    "gpt2": 'Let me see.<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>',
    "llama": '{"name": "multiply", "parameters": {"a": 3, "b": 4}}',
    "qwen2": 'Let me see.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
}
CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}


def sampled_call(tokenizer, family):
    """The call as a sampler might spell it: Qwen2's <tool_call> tokens whole, every other character alone."""
    text = CALL_TEXT[family]
    if family != "qwen2":
        return char_ids(tokenizer, text) + [tokenizer.eos_token_id]
    start, end = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    inner = text.split("<tool_call>")[1].split("</tool_call>")[0]
    head = char_ids(tokenizer, "Let me see.\n")
    return head + [start] + char_ids(tokenizer, inner) + [end, tokenizer.eos_token_id]


def prompt_of(tokenizer, question, tools=None):
    messages = [{"role": "user", "content": question}]
    return render_ids(tokenizer, messages, add_generation_prompt=True, tools=tools)


def run(backend, prompts, boxes, tokenizer, **overrides):
    settings = dict(
        max_iterations=None,
        max_completion_length=300,
        max_model_length=None,
        logprob_temperature=1.0,
        tool_timeout=5.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    settings.update(overrides)
    params = SamplingParams(settings["max_completion_length"], stop_token_ids=(tokenizer.eos_token_id,))
    return run_episodes(backend, params, prompts, boxes, tokenizer, **settings)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_trained_ids_mask_and_logprobs_are_the_sampled_and_inserted_ones(family):
    tokenizer = tool_chat_tokenizer(family)
    box = ToolBox([multiply])
    tool_prompt = prompt_of(tokenizer, "What is 3 times 4?", box.schemas)
    plain_prompt = prompt_of(tokenizer, "Say hi.")
    first = sampled_call(tokenizer, family)
    second = char_ids(tokenizer, "It is 12.") + [tokenizer.eos_token_id]
    hello = char_ids(tokenizer, "Hi.") + [tokenizer.eos_token_id]
    # the sampled spelling is not the one encoding its text gives: re-tokenising would change the ids
    assert tokenizer(tokenizer.decode(first), add_special_tokens=False)["input_ids"] != first
    backend = ScriptedBackend({tuple(tool_prompt): [first, second], tuple(plain_prompt): [hello]}, 1)

    tool_ep, plain_ep = run(backend, [tool_prompt, plain_prompt], [box, None], tokenizer)

    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])
    assert tool_ep.prompt_ids == tool_prompt
    assert tool_ep.completion_ids == first + suffix + second
    assert tool_ep.model_mask == [True] * len(first) + [False] * len(suffix) + [True] * len(second)
    expected_logprobs = scripted_logprobs(first, 0) + [0.0] * len(suffix) + scripted_logprobs(second, 1)
    assert tool_ep.logprobs == expected_logprobs
    content = "" if family == "llama" else "Let me see."
    assert tool_ep.messages == [
        {"role": "assistant", "content": content, "tool_calls": [CALL]},
        {"role": "tool", "name": "multiply", "content": "12"},
        {"role": "assistant", "content": "It is 12."},
    ]
    counters = (tool_ep.tool_calls, tool_ep.tool_errors, tool_ep.malformed_calls, tool_ep.turns)
    assert counters == (1, 0, 0, 2) and tool_ep.inserted_tokens == len(suffix)
    assert not tool_ep.truncated and not tool_ep.hit_iteration_cap
    assert plain_ep.completion_ids == hello and plain_ep.model_mask == [True] * len(hello)
    assert plain_ep.messages == [{"role": "assistant", "content": "Hi."}] and plain_ep.turns == 1
    # turn 1: both rows in one call; turn 2: only the tool row, its context the sampled ids + the suffix
    assert [len(call["contexts"]) for call in backend.calls] == [2, 1]
    assert backend.calls[1]["contexts"][0] == tool_prompt + first + suffix
    assert backend.calls[1]["max_new_tokens"] == 300 - len(first) - len(suffix)


def test_a_tiny_model_that_calls_no_tool_gives_one_plain_sample():
    tokenizer = tool_chat_tokenizer("gpt2")  # adds no tokens: the tiny model knows every id
    model = tiny_model("gpt2").eval()
    box = ToolBox([multiply])
    prompts = [prompt_of(tokenizer, q, box.schemas) for q in ("What is 3 times 4?", "Hello there.")]
    backend = DecodeLoopBackend(model, tokenizer.pad_token_id)
    params = SamplingParams(12, temperature=1.0, stop_token_ids=(tokenizer.eos_token_id,))
    torch.manual_seed(0)
    settings = dict(max_iterations=None, max_model_length=512, tool_timeout=5.0, logprob_temperature=1.0)
    episodes = run_episodes(
        backend, params, prompts, [box, box], tokenizer, max_completion_length=12, pad_token_id=1, **settings
    )
    torch.manual_seed(0)
    ids, mask = pad_left([torch.tensor(p) for p in prompts], 1)
    direct = backend.generate(ids, mask, params, logprob_temperature=1.0)
    for row, episode in enumerate(episodes):
        real = direct.response_mask[row]
        assert episode.completion_ids == direct.responses[row][real].tolist()
        torch.testing.assert_close(torch.tensor(episode.logprobs), direct.logprobs[row][real])
        assert all(episode.model_mask) and episode.turns == 1 and episode.tool_calls == 0
        assert episode.messages == [{"role": "assistant", "content": episode.messages[0]["content"]}]


@pytest.mark.parametrize("backend_class", [DecodeLoopBackend, HFGenerationBackend])
def test_later_turns_are_sampled_on_exactly_the_sequence_the_trainer_scores(backend_class):
    tokenizer = tool_chat_tokenizer("gpt2")
    model = tiny_model("gpt2").eval()
    box = ToolBox([multiply])
    prompt = prompt_of(tokenizer, "What is 3 times 4?", box.schemas)
    first = sampled_call(tokenizer, "gpt2")
    backend = ScriptedFirstTurn(first, backend_class(model, tokenizer.pad_token_id))
    torch.manual_seed(0)
    budget = len(first) + 30
    settings = dict(max_completion_length=budget, logprob_temperature=0.7)
    (episode,) = run(backend, [prompt], [box], tokenizer, **settings)
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])
    assert episode.completion_ids[: len(first) + len(suffix)] == first + suffix and episode.turns == 2
    # the trainer's forward pass over prompt + completion gives the sampler's logprobs at the model's tokens
    sequence = torch.tensor([prompt + episode.completion_ids])
    with torch.no_grad():
        logits = model(sequence).logits[0, len(prompt) - 1 : -1].float() / 0.7
    scored = logits.log_softmax(-1).gather(1, sequence[0, len(prompt) :, None])[:, 0]
    second = torch.tensor(episode.model_mask) & (torch.arange(len(episode.model_mask)) >= len(first))
    assert second.sum() > 0
    torch.testing.assert_close(torch.tensor(episode.logprobs)[second], scored[second], atol=1e-4, rtol=1e-4)
