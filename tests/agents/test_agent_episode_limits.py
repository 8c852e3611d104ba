"""run_episodes at its limits: the iteration cap, budgets that a tool result would overflow, bad calls,
tools that fail, and the metrics that count all of it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from scripted_backend import ScriptedBackend, char_ids, scripted_logprobs

from rlhfkit.agents import Episode, ToolBox, episode_metrics, run_episodes
from rlhfkit.agents.turns import render_ids, tool_suffix_ids
from rlhfkit.rollout import SamplingParams
from rlhfkit.testing.chat_templates import tool_chat_tokenizer

TOKENIZER = tool_chat_tokenizer("gpt2")
EOS = TOKENIZER.eos_token_id
RELEASE = threading.Event()  # set when the module's tests are done: the hanging tool's thread then ends


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def echo(text: str, times: int) -> str:
    """Repeat a text.

    Args:
        text: The text.
        times: How many times.
    """
    return text * times


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def hang(seconds: int) -> str:
    """Never answer in time.

    Args:
        seconds: Ignored.
    """
    RELEASE.wait(60)
    return "late"


async def async_add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    await asyncio.sleep(0.01)
    return a + b


def stats(values: list[int]) -> dict:
    """Sum and count.

    Args:
        values: The numbers.
    """
    return {"sum": sum(values), "count": len(values)}


def quit_now(code: int) -> int:
    """Exit.

    Args:
        code: The status.
    """
    raise SystemExit(code)


TOOLS = [multiply, echo, divide, hang, async_add, stats, quit_now]


@pytest.fixture(scope="module", autouse=True)
def _release_hanging_tools():
    yield
    RELEASE.set()


def said(text: str) -> list[int]:
    return char_ids(TOKENIZER, text) + [EOS]


def calls(name: str, **arguments) -> list[int]:
    import json

    return said(f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")


def suffix(*contents: str, name: str = "multiply") -> list[int]:
    return tool_suffix_ids(TOKENIZER, [{"role": "tool", "name": name, "content": c} for c in contents])


def episode(turns: list[list[int]], *, question="What is 3 times 4?", **overrides):
    """The one episode of a scripted conversation, and the backend that played it."""
    box = ToolBox(TOOLS)
    prompt = render_ids(TOKENIZER, [{"role": "user", "content": question}], add_generation_prompt=True)
    backend = ScriptedBackend({tuple(prompt): turns}, TOKENIZER.pad_token_id)
    settings = dict(
        max_iterations=None,
        max_completion_length=400,
        max_model_length=None,
        logprob_temperature=1.0,
        tool_timeout=5.0,
        pad_token_id=TOKENIZER.pad_token_id,
    )
    settings.update(overrides)
    params = SamplingParams(settings["max_completion_length"], stop_token_ids=(EOS,))
    (result,) = run_episodes(backend, params, [prompt], [box], TOKENIZER, **settings)
    return result, backend


THREE_CALLS = [calls("multiply", a=1, b=2), calls("multiply", a=2, b=3), calls("multiply", a=3, b=4)]


@pytest.mark.parametrize(
    ("cap", "turns", "calls_run", "capped"),
    [(None, 4, 3, False), (3, 4, 3, False), (1, 2, 1, True), (0, 1, 0, True)],
)
def test_the_iteration_cap_stops_the_rounds_of_tools(cap, turns, calls_run, capped):
    result, backend = episode(THREE_CALLS + [said("Done.")], max_iterations=cap)
    assert (result.turns, result.tool_calls, result.hit_iteration_cap) == (turns, calls_run, capped)
    assert len(backend.calls) == turns
    expected = THREE_CALLS[0]
    for answer, turn in zip(
        ["2", "6", "12"][: turns - 1], (THREE_CALLS + [said("Done.")])[1:turns], strict=True
    ):
        expected = expected + suffix(answer) + turn
    assert result.completion_ids == expected and not result.truncated


def test_a_tool_result_that_would_overflow_the_budget_is_rolled_back():
    first = calls("echo", text="ab", times=100)
    room = len(first) + len(suffix("ab" * 100, name="echo")) - 1  # one token short of the result alone
    result, backend = episode([first, said("never sampled")], max_completion_length=room)
    assert result.completion_ids == first and all(result.model_mask)
    assert result.messages == [{"role": "assistant", "content": "", "tool_calls": [_call("echo", "ab", 100)]}]
    assert (result.tool_calls, result.inserted_tokens, result.turns, result.truncated) == (1, 0, 1, True)
    assert len(backend.calls) == 1


def _call(name, text, times):
    return {"type": "function", "function": {"name": name, "arguments": {"text": text, "times": times}}}


def test_a_result_that_leaves_no_room_for_a_reply_is_rolled_back_too():
    first = calls("multiply", a=3, b=4)
    exact = len(first) + len(suffix("12"))
    result, _ = episode([first, said("12")], max_completion_length=exact)
    assert result.completion_ids == first and result.truncated
    result, backend = episode([first, said("It is 12.")], max_completion_length=exact + 3)
    assert result.completion_ids == first + suffix("12") + said("It is 12.")[:3]  # reply cut at the budget
    assert backend.calls[1]["max_new_tokens"] == 3 and result.truncated and result.turns == 2


def test_the_context_limit_rolls_back_like_the_budget():
    first = calls("echo", text="ab", times=100)
    question = [{"role": "user", "content": "What is 3 times 4?"}]
    prompt = len(render_ids(TOKENIZER, question, add_generation_prompt=True))
    limit = prompt + len(first) + 20  # the echoed text needs far more than 20 tokens
    result, backend = episode([first, said("never")], max_model_length=limit)
    assert result.completion_ids == first and result.truncated and len(backend.calls) == 1
    assert backend.calls[0]["max_new_tokens"] == limit - prompt  # turn 1 was bounded by the context too


def test_a_call_cut_off_by_the_budget_is_not_run():
    first = calls("multiply", a=3, b=4)
    result, _ = episode([first], max_completion_length=len(first) - 2)
    assert result.completion_ids == first[:-2] and result.truncated
    assert (result.tool_calls, result.malformed_calls, result.turns) == (0, 0, 1)


def test_a_malformed_call_is_counted_and_answered_with_an_error():
    bad = said('<tool_call>{"name": "multiply", "arguments": {"a": 3,}}</tool_call>')
    result, _ = episode([bad, said("Sorry.")])
    error = "error: malformed tool call: a tool call is not valid JSON (Expecting property name enclosed in "
    error += "double quotes at character 42)"
    assert result.messages[1] == {"role": "tool", "name": "invalid_tool_call", "content": error}
    inserted = tool_suffix_ids(TOKENIZER, [result.messages[1]])
    assert result.completion_ids == bad + inserted + said("Sorry.")
    assert (result.malformed_calls, result.tool_calls, result.tool_errors, result.turns) == (1, 0, 0, 2)


@pytest.mark.parametrize(
    ("turn", "answer", "error"),
    [
        (calls("divide", a=1, b=0), "error: tool 'divide' raised ZeroDivisionError: division by zero", True),
        (calls("hang", seconds=1), "error: tool 'hang' timed out after 0.3s", True),
        (calls("async_add", a=2, b=3), "5", False),
        (calls("stats", values=[1, 2, 3]), '{"sum": 6, "count": 3}', False),
        (
            calls("power", a=2),
            "error: unknown tool 'power' (tools: multiply, echo, divide, hang, async_add, stats, quit_now)",
            True,
        ),
        (
            calls("multiply", x=3, b=4),
            "error: bad arguments for tool 'multiply': unexpected 'x'; missing 'a' (it takes a, b)",
            True,
        ),
        (calls("quit_now", code=3), "error: tool 'quit_now' raised SystemExit: 3", True),
    ],
    ids=["raises", "hangs", "async", "dict", "unknown", "wrong-arguments", "system-exit"],
)
def test_whatever_a_tool_does_the_model_reads_an_answer_and_the_episode_goes_on(turn, answer, error):
    start = time.monotonic()
    result, _ = episode([turn, said("Ok.")], tool_timeout=0.3)
    assert time.monotonic() - start < 5
    name = result.messages[0]["tool_calls"][0]["function"]["name"]
    assert result.messages[1] == {"role": "tool", "name": name, "content": answer}
    assert result.completion_ids == turn + suffix(answer, name=name) + said("Ok.")
    assert (result.tool_calls, result.tool_errors, result.turns) == (1, int(error), 2)


def test_without_logprobs_from_the_backend_every_logprob_is_zero():
    first = calls("multiply", a=3, b=4)
    result, _ = episode([first, said("12")], logprob_temperature=None)
    assert result.logprobs == [0.0] * len(result.completion_ids)
    result, _ = episode([first, said("12")])
    assert result.logprobs[: len(first)] == scripted_logprobs(first, 0)


def test_metrics_count_per_episode():
    a = Episode([1], tool_calls=3, tool_errors=1, malformed_calls=1, turns=4, inserted_tokens=30)
    b = Episode([1], tool_calls=1, tool_errors=1, turns=2, inserted_tokens=10, hit_iteration_cap=True)
    c = Episode([1], turns=1)
    assert episode_metrics([a, b, c]) == {
        "tools/call_frequency": 4 / 3,
        "tools/failure_frequency": 2 / 4,
        "tools/errors": 2 / 3,
        "tools/malformed": 1 / 3,
        "tools/turns_mean": 7 / 3,
        "tools/inserted_tokens_mean": 40 / 3,
        "tools/iteration_cap_frac": 1 / 3,
    }
    assert episode_metrics([c])["tools/failure_frequency"] == 0.0
    with pytest.raises(ValueError, match="at least one episode"):
        episode_metrics([])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(toolboxes=[]), "toolboxes must hold one entry"),
        (dict(toolboxes=[[multiply]]), "toolboxes entries must be ToolBox instances or None"),
        (dict(max_iterations=-1), "max_iterations must be an integer >= 0 or None, got -1"),
        (dict(max_completion_length=0), "max_completion_length must be an integer >= 1, got 0"),
        (dict(max_model_length=3), r"prompt_ids\[0\] has 5 tokens, leaving no room .* max_model_length=3"),
        (dict(tool_timeout=0), "tool_timeout must be a positive number of seconds, got 0"),
        (dict(prompt_ids=[[]]), r"prompt_ids\[0\] is empty"),
    ],
)
def test_bad_arguments_are_refused_by_name(overrides, message):
    arguments = dict(prompt_ids=[[5, 6, 7, 8, 9]], toolboxes=[None])
    settings = dict(max_iterations=None, max_completion_length=8, max_model_length=None, tool_timeout=1.0)
    for key, value in overrides.items():
        (arguments if key in arguments else settings)[key] = value
    with pytest.raises(ValueError, match=message):
        run_episodes(
            ScriptedBackend({}, 1),
            SamplingParams(8),
            arguments["prompt_ids"],
            arguments["toolboxes"],
            TOKENIZER,
            logprob_temperature=None,
            pad_token_id=1,
            **settings,
        )
