"""The tiny tokenizer: round trips, special tokens, padding side, chat template."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlhfkit.testing import tiny_tokenizer, tiny_tokenizer_path
from rlhfkit.testing.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, ROLE_TOKENS, VOCAB_SIZE


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize(
    "text",
    [
        "I loved this movie, the acting was brilliant.",
        "  two  spaces\tand a tab\n",
        "naïve café ☕ 😀 ünïcödé",
        "",
    ],
)
def test_round_trip_any_text(tok, text):
    # byte-level BPE: every string, even characters absent from the corpus, decodes back exactly
    assert tok.decode(tok(text)["input_ids"]) == text


def test_common_words_are_single_tokens(tok):
    # the corpus is full of reviews, so BPE must have merged these frequent words (with their leading space)
    for word in [" movie", " great", " boring", " the"]:
        assert len(tok(word)["input_ids"]) == 1, word


def test_special_tokens(tok):
    assert len(tok) == VOCAB_SIZE
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.bos_token_id == tok.eos_token_id
    for role in ROLE_TOKENS:
        assert tok.convert_tokens_to_ids(role) not in (None, tok.unk_token_id)
        assert len(tok(role)["input_ids"]) == 1
    # no BOS/EOS silently added: what you encode is what the model sees
    assert tok("hello")["input_ids"] == tok.convert_tokens_to_ids(tok.tokenize("hello"))


def test_no_token_type_ids(tok):
    assert tok.model_input_names == ["input_ids", "attention_mask"]
    assert set(tok(["a", "bb"], padding=True, return_tensors="pt")) == {"input_ids", "attention_mask"}
    assert set(tok("first", "second")) == {"input_ids", "attention_mask"}
    # and it survives a plain AutoTokenizer load of the saved folder
    auto = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    assert set(auto("first", "second")) == {"input_ids", "attention_mask"}


def test_left_padding_by_default(tok):
    auto = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    for t in (tok, auto):
        assert t.padding_side == "left"
        batch = t(["a much longer sentence here", "short"], padding=True)
        short_ids, short_mask = batch["input_ids"][1], batch["attention_mask"][1]
        n_pad = len(short_ids) - len(t("short")["input_ids"])
        assert n_pad > 0
        assert short_ids[:n_pad] == [t.pad_token_id] * n_pad and short_mask[:n_pad] == [0] * n_pad
        assert short_mask[n_pad:] == [1] * (len(short_ids) - n_pad)


def test_padding_side_argument():
    right = tiny_tokenizer(padding_side="right")
    ids = right(["a much longer sentence", "short"], padding=True)["input_ids"][1]
    assert ids[-1] == right.pad_token_id and ids[0] != right.pad_token_id
    with pytest.raises(ValueError, match="padding_side"):
        tiny_tokenizer(padding_side="middle")


def test_chat_template(tok):
    assert tok.chat_template == CHAT_TEMPLATE
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Was the film good?"},
        {"role": "assistant", "content": "Yes, wonderful."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|system|>\nBe brief.<|endoftext|>\n"
        "<|user|>\nWas the film good?<|endoftext|>\n"
        "<|assistant|>\nYes, wonderful.<|endoftext|>\n"
    )
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|endoftext|>\n<|assistant|>\n")
    assert tok.apply_chat_template(messages[:2], tokenize=False).endswith("good?<|endoftext|>\n")
    # role markers and EOS stay single special tokens when the rendered text is encoded
    ids = tok(prompt)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|system|>")
    assert ids.count(tok.eos_token_id) == 2
    assert tok.convert_tokens_to_ids("<|assistant|>") in ids
