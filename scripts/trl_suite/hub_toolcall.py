"""Local stand-in for `trl-internal-testing/toolcall`: chats in which the assistant calls a tool.

Two configs, as TRL's tests read them: `language_modeling` (`messages`, `tools`) and `preference`
(`prompt`, `chosen`, `rejected`, `tools`). `tools` holds the row's tool schemas as a JSON string (the
tests also decode it into a list of dicts); the assistant's call is a message with `tool_calls`
(`{"type": "function", "function": {"name", "arguments"}}`, arguments as a dict) and its result a
`tool` message. Rows differ in which tools they offer and in their arguments' keys, so once stored as
Arrow structs the missing keys come back as None: the case TRL's `_as_json` tests guard against.
"""

from __future__ import annotations

import json

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}  # fmt: skip
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "The sum of two numbers.",
        "parameters": {
            "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}  # fmt: skip

CITIES = [("Paris", "sunny, 21 C"), ("Oslo", "snow, -3 C"), ("Lima", "cloudy, 18 C"), ("Cairo", "hot, 35 C")]
SUMS = [(3, 4), (10, 5), (7, 8), (12, 30)]
TRAIN = [*(("weather", city) for city in CITIES[:3]), *(("add", pair) for pair in SUMS[:3])]
TEST = [("weather", CITIES[3]), ("add", SUMS[3])]


def _exchange(kind: str, item: tuple) -> tuple[list[dict], list[dict], str, list[dict]]:
    """(the user's question, the assistant's tool call and the tool's answer, the right final reply, the
    row's tools) for one weather question (`item`: city, report) or one sum (`item`: a, b)."""
    if kind == "weather":
        city, report = item
        question, call, result = f"What is the weather in {city}?", ("get_weather", {"city": city}), report
        reply, tools = f"In {city} it is {report}.", [WEATHER]
    else:
        a, b = item
        question, call, result = f"What is {a} plus {b}?", ("add", {"a": a, "b": b}), str(a + b)
        reply, tools = f"{a} plus {b} is {a + b}.", [WEATHER, ADD]
    user = [{"role": "user", "content": question}]
    tool_call = {"type": "function", "function": {"name": call[0], "arguments": call[1]}}
    calling = {"role": "assistant", "content": "", "tool_calls": [tool_call]}
    answered = [calling, {"role": "tool", "name": call[0], "content": result}]
    return user, answered, reply, tools


def toolcall_row(config: str, kind: str, item: tuple) -> dict:
    """One row of config `config` ("language_modeling" or "preference"); KeyError for another config."""
    user, answered, reply, tools = _exchange(kind, item)
    good = [{"role": "assistant", "content": reply}]
    # the rejected reply ignores what the tool said
    bad = [{"role": "assistant", "content": "I cannot know that."}]
    rows = {
        "language_modeling": {"messages": user + answered + good},
        "preference": {"prompt": user + answered, "chosen": good, "rejected": bad},
    }
    return {**rows[config], "tools": json.dumps(tools)}


def toolcall_split(config: str, split: str) -> list[dict]:
    """The rows of one split ("train": 6 rows, "test": 2) of config `config`."""
    return [toolcall_row(config, kind, item) for kind, item in {"train": TRAIN, "test": TEST}[split]]
