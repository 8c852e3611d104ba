"""Tool-calling chat templates in three model families' formats, written for rlhfkit's tests and examples.

Each renders conversations the way its family does (the token layout, not the families' wording):

- "qwen2": ChatML turns `<|im_start|>role\\n...<|im_end|>\\n`, the tools listed in the system turn, calls as
  `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, results in a user turn inside
  `<tool_response>` tags; the end of turn is `<|im_end|>`.
- "llama": Llama 3.1 headers `<|start_header_id|>role<|end_header_id|>\\n\\n`, a call as one bare JSON
  object with "parameters", results in an `ipython` turn; the end of turn is `<|eot_id|>`.
- "gpt2": the tiny tokenizer's own `<|role|>\\n...<|endoftext|>\\n` shape, with the tools in the system turn,
  `<tool_call>{json}</tool_call>` calls in plain text and `<|tool|>` turns for results.

`tool_chat_tokenizer(family)` is the tiny tokenizer with that template and the tokens it needs (ids past the
tiny models' vocabulary for "qwen2" and "llama": for rollouts with scripted samplers; "gpt2" adds none).
"""

from __future__ import annotations

import os

_CALL_ARGUMENTS = (
    "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}"
)

QWEN2_TOOL_TEMPLATE = (
    "{% if messages and messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% endif %}"
    "{{ '<|im_start|>system\n' + system }}"
    "{% if tools %}"
    "{{ '\n\n# Tools\n\nYou may call the functions described inside <tools></tools>:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each call, reply with a JSON object of its name and arguments inside "
    '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <name>, "arguments": <object>}\n'
    "</tool_call>' }}"
    "{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% if message['content'] or not loop.first %}{{ '\n' }}{% endif %}"
    "{{ '<tool_call>\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    + _CALL_ARGUMENTS
    + "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or loop.previtem['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or loop.nextitem['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA_TOOL_TEMPLATE = (
    "{{ '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{% if tools %}"
    "{{ 'Environment: ipython\n\nTo call one of the functions below, reply with nothing but the JSON object "
    '{"name": <name>, "parameters": <object>}.\n\n\' }}'
    "{% for tool in tools %}{{ (tool | tojson) + '\n\n' }}{% endfor %}"
    "{% endif %}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{% if message['tool_calls'] | length != 1 %}"
    "{{ raise_exception('this template takes one tool call per assistant turn') }}{% endif %}"
    "{% set call = message['tool_calls'][0] %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"' + call['function']['name'] }}"
    '{{ \'", "parameters": \' }}' + _CALL_ARGUMENTS + "{{ '}<|eot_id|>' }}"
    "{% elif message['role'] in ('tool', 'ipython') %}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% else %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] + '<|eot_id|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

GPT2_TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|system|>\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n' }}{% endif %}"
    "{{ 'Tools:\n' }}{% for tool in tools %}{{ (tool | tojson) + '\n' }}{% endfor %}"
    '{{ \'Call one as <tool_call>{"name": <name>, "arguments": <object>}</tool_call>.<|endoftext|>\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and message['role'] == 'system' and loop.first) %}"
    "{{ '<|' + message['role'] + '|>\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    + _CALL_ARGUMENTS
    + "{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|endoftext|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

TOOL_CHAT_TEMPLATES = {"gpt2": GPT2_TOOL_TEMPLATE, "llama": LLAMA_TOOL_TEMPLATE, "qwen2": QWEN2_TOOL_TEMPLATE}

# family -> (special tokens, plain added tokens, end-of-turn token)
_FAMILY_TOKENS = {
    "gpt2": ((), (), "<|endoftext|>"),
    "llama": (
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
        (),
        "<|eot_id|>",
    ),
    "qwen2": (
        ("<|im_start|>", "<|im_end|>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        "<|im_end|>",
    ),
}


def tool_chat_tokenizer(family: str, cache_dir: str | os.PathLike | None = None):
    """The tiny tokenizer with `family`'s tool-calling template, its tokens, and its end of turn as EOS."""
    if family not in TOOL_CHAT_TEMPLATES:
        raise ValueError(f"family must be one of {sorted(TOOL_CHAT_TEMPLATES)}, got {family!r}")
    from rlhfkit.testing.tokenizer import tiny_tokenizer

    tokenizer = tiny_tokenizer(cache_dir)
    special, plain, end_of_turn = _FAMILY_TOKENS[family]
    if special:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": list(special)}, replace_extra_special_tokens=False
        )
    if plain:
        tokenizer.add_tokens(list(plain))
    tokenizer.eos_token = end_of_turn
    tokenizer.chat_template = TOOL_CHAT_TEMPLATES[family]
    return tokenizer
