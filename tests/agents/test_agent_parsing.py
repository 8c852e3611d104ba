"""parse_turn: tool calls read with json.loads from each family's format; bad blocks counted, not run."""

from __future__ import annotations

import pytest

from rlhfkit.agents.parsing import Turn, parse_hermes, parse_llama3, parse_turn, tool_call_format
from rlhfkit.testing import tiny_tokenizer
from rlhfkit.testing.chat_templates import tool_chat_tokenizer


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def ids_of(tokenizer, text):
    """A sampled turn: the text's ids and the end-of-turn token the model closes it with."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_hermes_blocks_become_calls_and_the_rest_is_content(family):
    tokenizer = tool_chat_tokenizer(family)
    text = (
        'Let me compute.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    )
    turn = parse_turn(tokenizer, ids_of(tokenizer, text), [], None)
    assert turn == Turn("Let me compute.", [call("multiply", a=3, b=4), call("add", a=1, b=2)], 0, [])


def test_a_plain_reply_has_no_calls():
    tokenizer = tool_chat_tokenizer("qwen2")
    turn = parse_turn(tokenizer, ids_of(tokenizer, "The answer is 12."), [], None)
    assert turn == Turn("The answer is 12.", [], 0, [])


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ('{"name": "multiply", "arguments": {"a": 3,}}', "a tool call is not valid JSON"),
        ('{"arguments": {"a": 3}}', 'a tool call needs a "name" string'),
        ('{"name": "multiply", "arguments": [3, 4]}', "the arguments of 'multiply' must be a JSON object"),
        ('["multiply", 3, 4]', "a tool call must be a JSON object"),
        ("{'name': 'multiply', 'arguments': {}}", "a tool call is not valid JSON"),  # Python, not JSON
    ],
)
def test_malformed_blocks_are_counted_with_their_reason(block, problem):
    turn = parse_hermes(f'<tool_call>{block}</tool_call> <tool_call>{{"name": "ok"}}</tool_call>')
    assert turn.tool_calls == [call("ok")]  # missing arguments: a call without any
    assert turn.malformed == 1 and turn.problems[0].startswith(problem)


def test_an_unclosed_block_is_malformed_and_cut_from_the_content():
    turn = parse_hermes('Trying <tool_call>{"name": "multiply", "arguments": {"a"')
    assert turn == Turn("Trying", [], 1, ["a <tool_call> block is not closed by </tool_call>"])


def test_arguments_written_as_a_json_string_are_read_but_never_evaluated():
    turn = parse_hermes(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": \\"__import__(\'os\')\\"}"}</tool_call>'
    )
    assert turn.tool_calls == [call("f", x="__import__('os')")]  # stays a string


def test_llama_replies_are_one_json_call_or_plain_text():
    tokenizer = tool_chat_tokenizer("llama")
    reply = '<|python_tag|>{"name": "multiply", "parameters": {"a": 3, "b": 4}}'
    assert parse_turn(tokenizer, ids_of(tokenizer, reply), [], None) == Turn(
        "", [call("multiply", a=3, b=4)], 0, []
    )
    plain = parse_turn(tokenizer, ids_of(tokenizer, "It is 12."), [], None)
    assert plain == Turn("It is 12.", [], 0, [])
    broken = parse_llama3('{"name": "multiply", "parameters": {"a": 3')
    assert broken.malformed == 1 and broken.tool_calls == [] and "not valid JSON" in broken.problems[0]


class ParsingTokenizer:
    """A tokenizer with a `response_template`: parse_turn must hand it the ids, prefix and tools."""

    response_template = {"type": "object"}
    eos_token, eos_token_id, pad_token_id = "</s>", 0, 1

    def __init__(self, parsed=None, fails=False):
        self.parsed, self.fails, self.seen = parsed, fails, None

    def parse_response(self, ids, prefix, tools):
        self.seen = (ids, prefix, tools)
        if self.fails:
            raise ValueError("no match")
        return self.parsed

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def test_a_response_template_parses_its_own_replies():
    parsed = {"role": "assistant", "content": "ok</s>", "tool_calls": [call("f", a=1), {"function": {}}]}
    tokenizer = ParsingTokenizer(parsed)
    turn = parse_turn(tokenizer, [5, 6, 0], [7, 8], [{"name": "f"}])
    assert tokenizer.seen == ([5, 6, 0], [7, 8], [{"name": "f"}])
    assert turn == Turn("ok", [call("f", a=1)], 1, ['a tool call needs a "name" string'])
    failing = parse_turn(ParsingTokenizer(fails=True), [5, 6, 0], [], None)
    assert failing.content == "5 6" and failing.malformed == 1 and failing.tool_calls == []


def test_a_template_without_a_known_call_format_is_refused():
    with pytest.raises(ValueError, match="cannot tell how this chat template writes tool calls"):
        tool_call_format(tiny_tokenizer())
    assert tool_call_format(tiny_tokenizer(), chat_template="{{ '<tool_call>' }}") == "hermes"
    assert tool_call_format(tool_chat_tokenizer("llama")) == "llama3"


def test_calls_drafted_while_reasoning_are_not_made():
    text = '<think>\nMaybe <tool_call>{"name": "drop_tables"}</tool_call>? No.\n</think>\n\nAsking.\n'
    text += '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
    turn = parse_hermes(text)
    assert turn.tool_calls == [call("multiply", a=3, b=4)] and turn.content == "Asking."
    assert turn.reasoning == 'Maybe <tool_call>{"name": "drop_tables"}</tool_call>? No.'
