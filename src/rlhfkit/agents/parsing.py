"""`parse_turn`: the text and the tool calls of one sampled assistant turn.

A tokenizer with a `response_template` (transformers >= 5.13) parses its own replies; otherwise the chat
template says how its family writes calls, and rlhfkit reads them with `json.loads` only:

- Hermes / Qwen2 style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, any number;
- Llama 3.1 style: the whole reply is one JSON object `{"name": ..., "parameters": {...}}`, after an
  optional `<|python_tag|>`.

A call block that does not parse (bad JSON, no name, arguments that are not an object, a block left open)
is counted in `Turn.malformed`, with its reason in `Turn.problems`, which the rollout sends back to the model
as an error tool message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

HERMES = "hermes"
LLAMA3 = "llama3"
RESPONSE_TEMPLATE = "response_template"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_THINK_END = "</think>"


@dataclass
class Turn:
    """One assistant turn: `content` (the text outside tool calls), `tool_calls` in chat-template form
    (`{"type": "function", "function": {"name": str, "arguments": dict}}`), `malformed` call blocks and,
    for each, what was wrong with it (`problems`)."""

    content: str
    tool_calls: list[dict]
    malformed: int
    problems: list[str] = field(default_factory=list)
    reasoning: str = ""  # the text before a closing </think>, when the turn has one


def _template_text(tokenizer: Any, chat_template: str | dict | None) -> str:
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template or ""


def tool_call_format(tokenizer: Any, chat_template: str | dict | None = None) -> str:
    """How replies of this tokenizer's chat template write tool calls: "response_template" (the tokenizer
    parses them), "hermes" or "llama3"; a ValueError when none of these applies."""
    if getattr(tokenizer, "response_template", None) is not None:
        return RESPONSE_TEMPLATE
    text = _template_text(tokenizer, chat_template)
    if "<tool_call>" in text:
        return HERMES
    if "ipython" in text or _PYTHON_TAG in text:
        return LLAMA3
    raise ValueError(
        "cannot tell how this chat template writes tool calls: it has neither <tool_call> blocks (Hermes, "
        "Qwen2) nor an ipython turn (Llama 3.1), and the tokenizer has no response_template. Use a chat "
        "template of one of those families (chat_template_path) or set tokenizer.response_template"
    )


def reply_text(tokenizer: Any, completion_ids: list[int]) -> str:
    """The decoded turn without its closing end-of-turn / pad tokens (special tokens inside are kept)."""
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    ids = list(completion_ids)
    while ids and ids[-1] in ends:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=False)


def _call(payload: Any) -> tuple[dict | None, str]:
    """(a tool call in chat-template form, "") or (None, what is wrong) for one parsed call object."""
    if not isinstance(payload, dict):
        return None, "a tool call must be a JSON object"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None, 'a tool call needs a "name" string'
    arguments = payload.get("arguments", payload.get("parameters"))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None, f"the arguments of {name!r} are not valid JSON"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"the arguments of {name!r} must be a JSON object"
    return {"type": "function", "function": {"name": name, "arguments": arguments}}, ""


def _call_from_json(text: str) -> tuple[dict | None, str]:
    try:
        payload = json.loads(text)
    except ValueError as error:
        return None, f"a tool call is not valid JSON ({error.msg} at character {error.pos})"
    return _call(payload)


def _collect(turn: Turn, found: tuple[dict | None, str]) -> None:
    call, problem = found
    if call is not None:
        turn.tool_calls.append(call)
    else:
        turn.malformed += 1
        turn.problems.append(problem)


def parse_hermes(text: str) -> Turn:
    """Hermes / Qwen2 `<tool_call>` blocks out of `text`; the rest, stripped, is the content. Calls are
    read after a closing </think> only: a call drafted while reasoning is not made."""
    reasoning, _, text = text.rpartition(_THINK_END)
    turn = Turn(content="", tool_calls=[], malformed=0, reasoning=reasoning.removeprefix("<think>").strip())
    for block in _HERMES_BLOCK.findall(text):
        _collect(turn, _call_from_json(block.strip()))
    rest = _HERMES_BLOCK.sub("", text)
    if "<tool_call>" in rest:  # opened, never closed (cut off, or the model forgot the closing tag)
        rest = rest[: rest.index("<tool_call>")]
        _collect(turn, (None, "a <tool_call> block is not closed by </tool_call>"))
    turn.content = rest.strip()
    return turn


def parse_llama3(text: str) -> Turn:
    """A Llama 3.1 reply: one JSON call object (after an optional <|python_tag|>), or plain content."""
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    if not body.startswith("{"):
        return Turn(content=text.strip(), tool_calls=[], malformed=0)
    turn = Turn(content="", tool_calls=[], malformed=0)
    _collect(turn, _call_from_json(body))
    return turn


def _parse_with_response_template(tokenizer: Any, completion_ids, prefix_ids, tools) -> Turn:
    try:
        parsed = tokenizer.parse_response(list(completion_ids), prefix=list(prefix_ids), tools=tools or None)
    except Exception as error:  # noqa: BLE001 - transformers' parsers raise assorted errors on bad replies
        text = reply_text(tokenizer, completion_ids)
        problem = f"the reply does not follow the chat template's format ({type(error).__name__})"
        return Turn(content=text.strip(), tool_calls=[], malformed=1, problems=[problem])
    parsed = parsed or {}
    content = parsed.get("content") or ""
    if isinstance(content, str) and tokenizer.eos_token:
        content = content.removesuffix(tokenizer.eos_token)
    turn = Turn(content=content if isinstance(content, str) else str(content), tool_calls=[], malformed=0)
    for call in parsed.get("tool_calls") or []:
        payload = call.get("function", call) if isinstance(call, dict) else call
        _collect(turn, _call(payload))
    return turn


def parse_turn(
    tokenizer: Any,
    completion_ids: list[int],
    prefix_ids: list[int],
    tools: list | None,
    *,
    chat_template: str | dict | None = None,
) -> Turn:
    """The content and tool calls of one sampled turn (`completion_ids`, its end-of-turn token included).

    `prefix_ids`: the tokens before the turn (what the template pre-wrote, e.g. an opening think tag) and
    `tools`: the tools offered, both used only by a tokenizer's `response_template` parser.
    `chat_template`: the template in use when it is not the tokenizer's own (it names the call format).
    """
    kind = tool_call_format(tokenizer, chat_template)
    if kind == RESPONSE_TEMPLATE:
        return _parse_with_response_template(tokenizer, completion_ids, prefix_ids, tools)
    text = reply_text(tokenizer, completion_ids)
    return parse_hermes(text) if kind == HERMES else parse_llama3(text)
