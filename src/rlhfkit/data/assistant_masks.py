"""Which tokens of a rendered chat belong to the assistant: the mask behind `assistant_only_loss`.

Two ways to find them, tried in this order:
  * the chat template marks the assistant turns with `{% generation %}` ... `{% endgeneration %}`
    blocks: transformers' `return_assistant_tokens_mask` reads them;
  * any other template, when its rendering is prefix-stable for the conversation: for assistant
    message i, the rendering of messages[:i] with the generation prompt is a prefix of the rendering of
    messages[:i+1], which is a prefix of the whole conversation's, and the whole rendering's tokens begin
    with the first rendering's tokens (no token crosses the start of the turn). The characters between the
    first two renderings are the assistant's turn (its content and end marker, after the role header
    the generation prompt already wrote); the whitespace a template puts after the end marker, before the
    next turn, is left out. A generation block around the content and end marker gives the same mask
    (TRL's patched ChatML templates put the newlines after the role and after <|im_end|> inside theirs,
    so train on those too).
A token is in the mask when it overlaps a turn's characters (offset mapping of the full rendering), as
transformers decides for the generation blocks, so both ways give the same mask on the same template.

Where TRL 1.x swaps in patched templates with generation blocks for the model families it knows, the
prefix method needs no per-family template; a template that renders earlier turns differently once the
conversation goes on (reasoning dropped from past turns, say) is refused with an error saying so.
"""

from __future__ import annotations

import re
from typing import Any

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")

_FIX = "give such a template with `chat_template_path` (a .jinja file) or set tokenizer.chat_template"


def has_generation_blocks(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template has {% generation %} blocks."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    return bool(GENERATION_BLOCK.search(template))


def assistant_token_mask(
    tokenizer: Any, messages: list[dict], **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """(input_ids, mask) of a rendered chat, mask 1 on every assistant turn's tokens and 0 elsewhere.

    From the template's {% generation %} blocks when it has them, else by the prefix method (module
    docstring). Raises ValueError when neither applies, or when no token is an assistant's.
    """
    if has_generation_blocks(tokenizer):
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **template_kwargs
        )
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    else:
        ids, mask = prefix_assistant_mask(tokenizer, messages, **template_kwargs)
    if not any(mask):
        raise ValueError(
            "assistant_only_loss=True: a conversation has no assistant token (no assistant message, or "
            "the assistant turns render as nothing)"
        )
    return ids, mask


def prefix_assistant_mask(
    tokenizer: Any, messages: list[dict], **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """(input_ids, mask) by the prefix method: the assistant turns located by rendering the conversation
    up to each of them. Needs a fast tokenizer (offset mapping)."""
    full = tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
    encoded = _encode(tokenizer, full)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], True, template_kwargs, i)
        upto = _render(tokenizer, messages[: i + 1], False, template_kwargs, i)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise _not_prefix_stable(i, "its rendering does not extend the rendering before it")
        if _encode(tokenizer, before)["input_ids"] != ids[: _token_count(offsets, len(before))]:
            raise _not_prefix_stable(i, "the whole conversation's tokens cross the start of the turn")
        spans.append((len(before), _turn_end(upto, len(before), message.get("content"))))
    return ids, overlap_mask(offsets, spans)


def overlap_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters [start, end) overlap one of the character spans, else 0."""
    return [int(any(start < hi and end > lo for lo, hi in spans if lo < hi)) for start, end in offsets]


def _turn_end(upto: str, start: int, content: Any) -> int:
    """Where the turn that begins at `start` ends in `upto`: before the trailing whitespace, unless that
    whitespace is the end of the message's own content."""
    end = len(upto.rstrip())
    if isinstance(content, str) and content:
        at = upto.find(content, start)
        if at >= 0:
            end = max(end, at + len(content))
    return max(end, start)


def _token_count(offsets: list[tuple[int, int]], chars: int) -> int:
    """How many leading tokens end within the first `chars` characters."""
    return sum(1 for _, end in offsets if end <= chars)


def _render(
    tokenizer: Any, messages: list[dict], generation_prompt: bool, template_kwargs: dict, index: int
) -> str:
    """The chat template's text for `messages`: a conversation cut at its assistant message `index`."""
    from jinja2.exceptions import TemplateError

    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **template_kwargs
        )
    except TemplateError as err:
        raise _not_prefix_stable(index, f"the template cannot render the part up to it: {err}") from err


def _encode(tokenizer: Any, text: str) -> dict:
    """`text`'s ids and character offsets, tokenised as apply_chat_template does (no special tokens added)."""
    try:
        return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as err:  # slow (Python) tokenizers have no offset mapping
        raise ValueError(
            "assistant_only_loss=True with a chat template that has no {% generation %} blocks needs a fast "
            "tokenizer (its offset mapping locates the assistant turns)"
        ) from err


def _not_prefix_stable(index: int, why: str) -> ValueError:
    return ValueError(
        "assistant_only_loss=True needs a chat template that marks the assistant turns with "
        "{% generation %} ... {% endgeneration %} blocks, or one whose rendering of a conversation begins "
        "with its rendering of every shorter part of it (prefix-stable); the tokenizer's has no such blocks "
        f"and is not prefix-stable for this conversation at message {index} ({why}); " + _FIX
    )
