"""The tokens a chat template puts between two assistant turns, found without re-tokenising sampled text.

After a turn that called tools, the conversation goes on with the tool messages and a new generation prompt.
Rendering the whole conversation again and tokenising it would re-tokenise what the model sampled (a word it
spelled in two tokens may come back as one), so the trained ids would not be the sampled ids. Instead
`tool_suffix_ids` renders a stand-in conversation with and without the tool messages and keeps only the
difference, starting right after the end-of-turn token that closes the assistant's turn: the rollout appends
that difference to the sampled ids. This needs a template that renders a turn the same way whatever follows
it, which `check_prefix_preserving` checks once, up front.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.data.chat_templates import render_ids

_STAND_IN_USER = {"role": "user", "content": "dummy"}


def _calling_turn(names: list[str]) -> dict:
    """A stand-in assistant turn that called the tools `names` (the real names: some templates head a tool
    message with the name of the call it answers)."""
    calls = [{"type": "function", "function": {"name": name, "arguments": {}}} for name in names]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def _trim_at_end_of_turn(ids: list[int], eos_token_id: int | None) -> list[int]:
    """`ids` up to and including their last end-of-turn token: what the model itself samples, the
    newline some templates write after it (ChatML) belongs to the suffix."""
    if eos_token_id is None or eos_token_id not in ids:
        return ids
    last = len(ids) - 1 - ids[::-1].index(eos_token_id)
    return ids[: last + 1]


def tool_suffix_ids(
    tokenizer: Any, tool_messages: list[dict], chat_template: str | None = None, **template_kwargs: Any
) -> list[int]:
    """The ids the chat template puts after an assistant turn's end-of-turn token for `tool_messages`
    (each `{"role": "tool", "name": ..., "content": ...}`), up to and including the next assistant
    generation prompt. Only this inserted text is tokenised."""
    if not tool_messages:
        raise ValueError("tool_messages must hold at least one tool message")
    head = [_STAND_IN_USER, _calling_turn([str(m.get("name") or "tool") for m in tool_messages])]
    before = render_ids(
        tokenizer, head, add_generation_prompt=False, chat_template=chat_template, **template_kwargs
    )
    after = render_ids(
        tokenizer,
        head + list(tool_messages),
        add_generation_prompt=True,
        chat_template=chat_template,
        **template_kwargs,
    )
    before = _trim_at_end_of_turn(before, tokenizer.eos_token_id)
    if after[: len(before)] != before:
        raise ValueError(_NOT_PREFIX_PRESERVING)
    return after[len(before) :]


_NOT_PREFIX_PRESERVING = (
    "the chat template renders an assistant turn differently once tool messages follow it (for instance it "
    "drops the reasoning of earlier turns), so the tokens the model sampled would not be the ones the "
    "template shows on the next turn. Use a template that leaves earlier turns as they were: pass its "
    "file as chat_template_path"
)


def check_prefix_preserving(tokenizer: Any, chat_template: str | None = None, **template_kwargs: Any) -> None:
    """A ValueError (naming the fix, `chat_template_path`) when the template re-renders an assistant turn
    differently once a tool message follows it: tool results could not then be appended token by token."""
    head = [_STAND_IN_USER, _calling_turn(["dummy"])]
    tool = {"role": "tool", "name": "dummy", "content": "dummy"}
    alone = render_ids(
        tokenizer, head, add_generation_prompt=False, chat_template=chat_template, **template_kwargs
    )
    followed = render_ids(
        tokenizer, head + [tool], add_generation_prompt=True, chat_template=chat_template, **template_kwargs
    )
    if followed[: len(alone)] != alone:
        raise ValueError(_NOT_PREFIX_PRESERVING)
