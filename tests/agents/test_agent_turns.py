"""tool_suffix_ids: exactly the template's text between two assistant turns, tokenised on its own."""

from __future__ import annotations

import pytest

from rlhfkit.agents.turns import check_prefix_preserving, render_ids, tool_suffix_ids
from rlhfkit.testing.chat_templates import tool_chat_tokenizer

TOOL = {"role": "tool", "name": "multiply", "content": "12"}
TOOL_CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
# What each family's template writes after the closing end-of-turn token of a turn that called a tool
EXPECTED = {
    "gpt2": "\n<|tool|>\n12<|endoftext|>\n<|assistant|>\n",
    "llama": "<|start_header_id|>ipython<|end_header_id|>\n\n12<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "qwen2": "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_suffix_is_the_template_text_after_the_end_of_turn(family):
    tokenizer = tool_chat_tokenizer(family)
    suffix = tool_suffix_ids(tokenizer, [TOOL])
    assert suffix == tokenizer(EXPECTED[family], add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(suffix) == EXPECTED[family]


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_turn_plus_suffix_is_what_the_template_renders_for_the_whole_conversation(family):
    tokenizer = tool_chat_tokenizer(family)
    calling = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    head = [{"role": "user", "content": "What is 3 times 4?"}, calling]
    turn = render_ids(tokenizer, head, add_generation_prompt=False)
    end = len(turn) - 1 - turn[::-1].index(tokenizer.eos_token_id)
    whole = render_ids(tokenizer, head + [TOOL], add_generation_prompt=True)
    assert turn[: end + 1] + tool_suffix_ids(tokenizer, [TOOL]) == whole


def test_several_results_share_one_user_turn_in_qwen2_style():
    tokenizer = tool_chat_tokenizer("qwen2")
    second = {"role": "tool", "name": "add", "content": "error: tool 'add' raised ValueError"}
    text = tokenizer.decode(tool_suffix_ids(tokenizer, [TOOL, second]))
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n12\n</tool_response>\n<tool_response>\n"
        "error: tool 'add' raised ValueError\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_keywords_reach_the_template():
    tokenizer = tool_chat_tokenizer("gpt2")
    template = tokenizer.chat_template.replace("'<|assistant|>\n'", "'<|assistant|>' + mood + '\n'")
    assert template != tokenizer.chat_template
    suffix = tool_suffix_ids(tokenizer, [TOOL], chat_template=template, mood=" calm")
    assert tokenizer.decode(suffix).endswith("<|assistant|> calm\n")


def test_no_tool_messages_is_an_error():
    with pytest.raises(ValueError, match="tool_messages must hold at least one"):
        tool_suffix_ids(tool_chat_tokenizer("gpt2"), [])


# Renders an assistant turn's tool calls only while it is the last message: a later turn rewrites it.
FORGETFUL = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{% if message.get('tool_calls') and loop.last %}{{ '<tool_call>' }}{% endif %}"
    "{{ '<|endoftext|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_prefix_preserving_templates_pass(family):
    check_prefix_preserving(tool_chat_tokenizer(family))


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_fix():
    tokenizer = tool_chat_tokenizer("gpt2")
    with pytest.raises(ValueError, match="differently once tool messages follow.*chat_template_path"):
        check_prefix_preserving(tokenizer, chat_template=FORGETFUL)
    with pytest.raises(ValueError, match="chat_template_path"):
        tool_suffix_ids(tokenizer, [TOOL], chat_template=FORGETFUL)
