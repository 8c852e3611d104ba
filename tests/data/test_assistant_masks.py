"""assistant_only_loss masks: the prefix method (templates without {% generation %} blocks) gives the same
mask as the generation blocks on the same template, trains every assistant turn and nothing else, and
refuses templates that are not prefix-stable."""

from __future__ import annotations

import re

import pytest

from rlhfkit.data.assistant_masks import assistant_token_mask, overlap_mask, prefix_assistant_mask
from rlhfkit.testing import tiny_tokenizer
from rlhfkit.testing.tokenizer import GENERATION_CHAT_TEMPLATE

# Fixture templates in the shape of three families, each with the assistant turns inside {% generation %}
# blocks (content and end marker; the header before and the newline after stay outside). `_plain` strips
# the blocks, leaving the same rendering with nothing marked: the template the prefix method gets.
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{{ '<tool_call>' + call['function']['name'] + '</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\n\n' }}"
    "{% if role == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
ZEPHYR = (  # Zephyr's layout with GPT-2's end-of-text token as the end marker
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
FAMILY_TOKENS = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHATS = [
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ok then"},
    ],
    [
        {"role": "user", "content": "the weather in town?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {}}}],
        },
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains.\nTake a coat."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": " you are welcome "},
    ],
    [
        {"role": "user", "content": "a dog ran far"},
        {"role": "assistant", "content": "the cat sat on the mat"},
    ],
]


def _plain(template: str) -> str:
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def _tokenizer(template: str, family_tokens: bool):
    tok = tiny_tokenizer(padding_side="right")
    if family_tokens:  # as a real ChatML / Llama-3 tokenizer has them; without, the markers are byte pieces
        tok.add_special_tokens({"additional_special_tokens": FAMILY_TOKENS})
    tok.chat_template = template
    return tok


def _runs(tok, ids: list[int], mask: list[int]) -> list[tuple[str, int]]:
    """The rendering cut where the mask changes: (text of the tokens, their mask value) for each run."""
    runs: list[tuple[list[int], int]] = []
    for token, bit in zip(ids, mask):
        if runs and runs[-1][1] == bit:
            runs[-1][0].append(token)
        else:
            runs.append(([token], bit))
    return [(tok.decode(tokens), bit) for tokens, bit in runs]


@pytest.mark.parametrize("family_tokens", [True, False])
@pytest.mark.parametrize(
    "template", [GENERATION_CHAT_TEMPLATE, CHATML, LLAMA3, ZEPHYR], ids=["tiny", "chatml", "llama3", "zephyr"]
)
def test_prefix_method_gives_the_generation_block_mask(template, family_tokens):
    marked, plain = _tokenizer(template, family_tokens), _tokenizer(_plain(template), family_tokens)
    for chat in CHATS:
        kept = [m for m in chat if m["role"] != "tool"] if template is GENERATION_CHAT_TEMPLATE else chat
        assert marked.apply_chat_template(kept, tokenize=False) == plain.apply_chat_template(
            kept, tokenize=False
        )
        ids, mask = assistant_token_mask(marked, kept)
        assert prefix_assistant_mask(plain, kept) == (ids, mask)
        assert assistant_token_mask(plain, kept) == (ids, mask)
        assert ids == plain.apply_chat_template(kept, tokenize=True, return_dict=True)["input_ids"]
        # every assistant turn is trained, nothing else: the trained runs are the turns' texts, in order
        trained = [text for text, bit in _runs(plain, ids, mask) if bit]
        assert len(trained) == sum(m["role"] == "assistant" for m in kept)


def test_llama3_mask_by_hand():
    tok = _tokenizer(_plain(LLAMA3), family_tokens=True)
    ids, mask = assistant_token_mask(tok, CHATS[0])
    bos, head, end = tok.bos_token, "<|start_header_id|>", "<|end_header_id|>\n\n"
    # by hand from the template: each turn is header + trimmed content + <|eot_id|>; the assistant's
    # content and <|eot_id|> train, the header before them ("...assistant<|end_header_id|>\n\n") does not
    assert _runs(tok, ids, mask) == [
        (f"{bos}{head}system{end}be brief<|eot_id|>{head}user{end}hi<|eot_id|>{head}assistant{end}", 0),
        ("yo<|eot_id|>", 1),
        (f"{head}user{end}bye<|eot_id|>{head}assistant{end}", 0),
        ("ok then<|eot_id|>", 1),
    ]
    # token by token around the first turn (byte-level "Ċ" is "\n"; the tiny vocabulary merges neither
    # "\n\n" nor "yo"): the header's last tokens are 0, the content and <|eot_id|> 1, the next header 0
    start = mask.index(1)
    assert tok.convert_ids_to_tokens(ids[start - 3 : start + 4]) == [
        "<|end_header_id|>", "Ċ", "Ċ", "y", "o", "<|eot_id|>", "<|start_header_id|>"
    ]  # fmt: skip
    assert mask[start - 3 : start + 4] == [0, 0, 0, 1, 1, 1, 0]


def test_the_turn_keeps_its_content_and_end_marker_not_the_newline_after():
    tok = _tokenizer(_plain(CHATML), family_tokens=True)
    ids, mask = assistant_token_mask(tok, CHATS[1])
    trained = [text for text, bit in _runs(tok, ids, mask) if bit]
    assert trained == [
        "<tool_call>weather</tool_call><|im_end|>",
        "It rains.\nTake a coat.<|im_end|>",  # a newline inside the content trains
        " you are welcome <|im_end|>",
    ]
    # no end marker: the turn ends with its content, its own trailing space included, before the "\n"
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ':' + m['content'] + '\n' }}{% endfor %}"
    tok.chat_template += "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " hey "}, CHATS[0][3]]
    ids, mask = assistant_token_mask(tok, chat)
    assert [text for text, bit in _runs(tok, ids, mask) if bit] == [" hey "]


def test_overlap_mask_marks_every_token_touching_a_span():
    # tokens [0,2) [2,5) [5,6) [6,9); spans [3,6) and an empty [8,8): tokens 1 and 2 overlap the first
    assert overlap_mask([(0, 2), (2, 5), (5, 6), (6, 9)], [(3, 6), (8, 8)]) == [0, 1, 1, 0]


REASONING = (  # Qwen3-like: an assistant turn shows its reasoning only while it is the last message
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|assistant|>\n' }}"
    "{% if loop.last and message['reasoning'] %}"
    "{{ '<think>' + message['reasoning'] + '</think>' }}{% endif %}"
    "{{ message['content'] + eos_token + '\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def test_a_template_that_is_not_prefix_stable_is_refused():
    tok = _tokenizer(REASONING, family_tokens=False)
    one_turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning": "r"}]
    ids, mask = assistant_token_mask(tok, one_turn)  # stable for one turn: its reasoning trains with it
    assert [text for text, bit in _runs(tok, ids, mask) if bit] == ["<think>r</think>yo<|endoftext|>"]
    two_turns = [*one_turn, {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(
        ValueError, match=r"assistant_only_loss=True needs .*\{% generation %\}.*at message 1"
    ):
        assistant_token_mask(tok, two_turns)
    # the rendering is a prefix as text, but " yo" is one token across the end of the header "assistant: "
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    tok.chat_template += "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    with pytest.raises(ValueError, match="tokens cross the start of the turn"):
        assistant_token_mask(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    with pytest.raises(ValueError, match="no assistant token"):
        assistant_token_mask(tok, [{"role": "user", "content": "hi"}])
