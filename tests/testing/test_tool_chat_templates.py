"""The tool-calling chat templates of rlhfkit.testing render each family's layout, on the tiny tokenizer."""

from __future__ import annotations

import pytest

from rlhfkit.testing.chat_templates import tool_chat_tokenizer

CONVERSATION = [
    {"role": "user", "content": "3 times 4?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}],
    },
    {"role": "tool", "name": "multiply", "content": "12"},
    {"role": "assistant", "content": "12."},
]

RENDERED = {
    "gpt2": (
        "<|user|>\n3 times 4?<|endoftext|>\n"
        '<|assistant|>\n<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
        "<|endoftext|>\n"
        "<|tool|>\n12<|endoftext|>\n<|assistant|>\n12.<|endoftext|>\n"
    ),
    "llama": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n3 times 4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "multiply", "parameters": {"a": 3, "b": 4}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n12<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n12.<|eot_id|>"
    ),
    "qwen2": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n3 times 4?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
        "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n12.<|im_end|>\n"
    ),
}


@pytest.mark.parametrize("family", sorted(RENDERED))
def test_each_family_renders_its_layout_and_round_trips_through_the_tokenizer(family):
    tokenizer = tool_chat_tokenizer(family)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert text == RENDERED[family]
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_tokens_and_end_of_turn_per_family():
    assert len(tool_chat_tokenizer("gpt2")) == 1000  # nothing added: the tiny models can sample it
    qwen2 = tool_chat_tokenizer("qwen2")
    assert qwen2.eos_token == "<|im_end|>" and len(qwen2("<tool_call>")["input_ids"]) == 1
    assert tool_chat_tokenizer("llama").eos_token == "<|eot_id|>"


def test_an_unknown_family_is_refused():
    refused = r"family must be one of \['gpt2', 'llama', 'qwen2'\], got 'mistral'"
    with pytest.raises(ValueError, match=refused):
        tool_chat_tokenizer("mistral")
