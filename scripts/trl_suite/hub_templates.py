"""Chat templates of the harness's tokenizer stand-ins (written for the harness, in the families' styles).

`CHATML` is every tiny model's: ChatML turns, tools listed in a system turn, tool calls as JSON between
`<tool_call>` markers. `QWEN3` stands in for the template of a Qwen3 checkpoint named as a
`chat_template_path`: the same turns plus Qwen3's habits, tool results gathered in a user turn between
`<tool_response>` markers and a `<think>` block before each assistant reply (empty unless the message has
`reasoning_content`; a generation prompt opens an empty one when `enable_thinking` is false).
`HARMONY` is the gpt-oss stand-in's: harmony turns, the assistant's `thinking` in an analysis channel.
"""

from __future__ import annotations

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")

_CONTENT = (
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{ part['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
)

CHATML = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    + _CONTENT
    + "{%- for call in message.get('tool_calls') or [] %}\n<tool_call>\n"
    "{{ {'name': (call.function or call).name, 'arguments': (call.function or call).arguments} | tojson }}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

# Text is emitted only through {{- '...' }} expressions, so block tags may trim whitespace freely
# (transformers renders templates with trim_blocks and lstrip_blocks).
_QWEN3_CONTENT = """
    {%- if message.content is string %}{{- message.content }}
    {%- elif message.content %}{%- for part in message.content %}
        {%- if part.type == 'text' %}{{- part.text }}{%- endif %}
    {%- endfor %}{%- endif %}"""
QWEN3 = (
    """
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools or has_system %}
    {{- '<|im_start|>system\\n' }}
    {%- if has_system %}{{- messages[0].content }}{%- endif %}
    {%- if tools %}
        {%- if has_system %}{{- '\\n\\n' }}{%- endif %}
        {{- '# Tools\\n\\nFunction signatures:\\n<tools>' }}
        {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
        {{- '\\n</tools>\\n\\nTo call one, reply with {"name": ..., "arguments": ...}' }}
        {{- ' inside <tool_call></tool_call>.' }}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}"""
    + _QWEN3_CONTENT
    + """{{- '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n<think>\\n' }}{{- (message.reasoning_content or '') | trim }}
        {{- '\\n</think>\\n\\n' }}"""
    + _QWEN3_CONTENT
    + """
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function or call %}
            {{- '\\n<tool_call>\\n{"name": ' }}{{- fn.name | tojson }}{{- ', "arguments": ' }}
            {%- if fn.arguments is string %}{{- fn.arguments }}
            {%- else %}{{- fn.arguments | tojson }}{%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' }}"""
    + _QWEN3_CONTENT
    + """{{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and not enable_thinking %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""
)

# gpt-oss's "harmony" turns: `<|start|>{role}<|message|>{content}<|end|>`, a system turn naming the
# reasoning effort, and each assistant reply as an `analysis` channel (its `thinking`, when it has one)
# then a `final` channel; the conversation's last reply ends with `<|return|>`, the others with `<|end|>`.
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>")
HARMONY = """
{%- macro text(message) %}
    {%- if message.content is string %}{{- message.content }}
    {%- elif message.content %}{%- for part in message.content %}
        {%- if part.type == 'text' %}{{- part.text }}{%- endif %}
    {%- endfor %}{%- endif %}
{%- endmacro %}
{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort or 'medium') + '<|end|>' }}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {%- if message.thinking %}
            {{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}
        {%- endif %}
        {{- '<|start|>assistant<|channel|>final<|message|>' }}{{- text(message) }}
        {{- '<|return|>' if loop.last else '<|end|>' }}
    {%- else %}
        {{- '<|start|>' + message.role + '<|message|>' }}{{- text(message) }}{{- '<|end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"""
