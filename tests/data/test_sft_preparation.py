"""SFT preparation, TRL 1.x's options: which positions train (mask 1) under each loss mode, truncation
sides, ShareGPT `conversations`, iterable datasets."""

from __future__ import annotations

import datasets
import pytest

from rlhfkit.data.chat_templates import apply_chat_template_path
from rlhfkit.data.preparation import prepare_sft_dataset, to_chatml, truncate
from rlhfkit.testing import tiny_tokenizer
from rlhfkit.testing.tokenizer import GENERATION_CHAT_TEMPLATE

CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "ok"},
]


@pytest.fixture
def tok():
    tokenizer = tiny_tokenizer(padding_side="right")
    tokenizer.chat_template = GENERATION_CHAT_TEMPLATE
    return tokenizer


def trained_mask(row: dict) -> list[int]:
    """1 where the prepared row's labels train (not -100)."""
    return [int(t != -100) for t in row["labels"]]


def _ds(rows):
    return datasets.Dataset.from_list(rows)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_assistant_only_loss_trains_every_assistant_turn_and_nothing_else(tok):
    row = prepare_sft_dataset(_ds([{"messages": CHAT}]), tok, 128, assistant_only_loss=True)[0]
    # by hand: "<|user|>\nhi<eos>\n<|assistant|>\n" [yo<eos>]
    #          "\n<|user|>\nbye<eos>\n<|assistant|>\n" [ok<eos>] "\n"   ([...]: inside {% generation %})
    user1 = _ids(tok, "<|user|>\nhi<|endoftext|>\n<|assistant|>\n")
    reply1 = _ids(tok, "yo<|endoftext|>")
    user2 = _ids(tok, "\n<|user|>\nbye<|endoftext|>\n<|assistant|>\n")
    reply2 = _ids(tok, "ok<|endoftext|>")
    newline = _ids(tok, "\n")
    assert row["input_ids"] == user1 + reply1 + user2 + reply2 + newline
    want = [0] * len(user1) + [1] * len(reply1) + [0] * len(user2) + [1] * len(reply2) + [0] * len(newline)
    assert trained_mask(row) == want
    plain = prepare_sft_dataset(_ds([{"messages": CHAT}]), tok, 128)[0]
    assert plain["input_ids"] == row["input_ids"] and all(trained_mask(plain))


def test_assistant_only_needs_a_prefix_stable_template_and_chat_rows(tok):
    marked = prepare_sft_dataset(_ds([{"messages": CHAT}]), tok, 128, assistant_only_loss=True)[0]
    tok.chat_template = tiny_tokenizer().chat_template  # the tiny tokenizer's own: no {% generation %}
    plain = prepare_sft_dataset(_ds([{"messages": CHAT}]), tok, 128, assistant_only_loss=True)[0]
    assert plain == marked  # the same rendering, the same turns found by rendering the chat up to each
    tok.chat_template = "{{ messages | length }} messages\n" + tok.chat_template  # changes as the chat grows
    with pytest.raises(
        ValueError,
        match=r"assistant_only_loss=True needs a chat template .*\{% generation %\}.*prefix-stable",
    ):
        prepare_sft_dataset(_ds([{"messages": CHAT}]), tok, 128, assistant_only_loss=True)
    tok.chat_template = GENERATION_CHAT_TEMPLATE
    with pytest.raises(ValueError, match="needs conversational rows"):
        prepare_sft_dataset(_ds([{"text": "hello"}]), tok, 128, assistant_only_loss=True)
    with pytest.raises(ValueError, match="no assistant token"):
        prepare_sft_dataset(_ds([{"messages": CHAT[:1]}]), tok, 128, assistant_only_loss=True)


def test_completion_only_default_follows_the_columns(tok):
    pairs = _ds([{"prompt": "Q: hi ", "completion": "fine"}])
    row = prepare_sft_dataset(pairs, tok, 64, completion_only_loss=None)[0]
    n_prompt = len(tok("Q: hi ")["input_ids"])
    assert trained_mask(row) == [0] * n_prompt + [1] * (len(_ids(tok, "fine")) + 1)  # + EOS
    assert all(trained_mask(prepare_sft_dataset(pairs, tok, 64, completion_only_loss=False)[0]))
    text = prepare_sft_dataset(_ds([{"text": "hello"}]), tok, 64, completion_only_loss=None)[0]
    assert all(trained_mask(text))  # language-modelling data: every token


def test_conversational_prompt_completion_with_both_masks(tok):
    rows = _ds([{"prompt": CHAT[:3], "completion": CHAT[3:]}])
    row = prepare_sft_dataset(rows, tok, 128, completion_only_loss=True, assistant_only_loss=True)[0]
    # the earlier assistant turn "yo" is in the prompt: only the completion's assistant tokens train
    trained = [t for t, m in zip(row["input_ids"], trained_mask(row)) if m]
    assert trained == _ids(tok, "ok<|endoftext|>")
    both_turns = prepare_sft_dataset(rows, tok, 128, completion_only_loss=False, assistant_only_loss=True)[0]
    trained = [t for t, m in zip(both_turns["input_ids"], trained_mask(both_turns)) if m]
    assert trained == _ids(tok, "yo<|endoftext|>") + _ids(tok, "ok<|endoftext|>")


def test_truncation_keeps_the_start_or_the_end(tok):
    assert truncate([1, 2, 3, 4], 2) == [1, 2] and truncate([1, 2, 3, 4], 2, "keep_end") == [3, 4]
    assert truncate([1, 2], None, "keep_end") == [1, 2]
    pairs = _ds([{"prompt": "a long prompt about the cat", "completion": "dog"}])
    end = prepare_sft_dataset(pairs, tok, 3, completion_only_loss=True, truncation_mode="keep_end")[0]
    full = prepare_sft_dataset(pairs, tok, 64, completion_only_loss=True)[0]
    assert end["input_ids"] == full["input_ids"][-3:] and end["labels"] == full["labels"][-3:]
    # keep_start leaves only prompt tokens: no trained token, so the row is dropped, and none is left
    with pytest.raises(ValueError, match="no trained token"):
        prepare_sft_dataset(pairs, tok, 3, completion_only_loss=True, truncation_mode="keep_start")


def test_sharegpt_conversations_are_messages(tok):
    sharegpt = [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "yo"}]
    assert to_chatml({"conversations": sharegpt, "id": 3}) == {"messages": CHAT[:2], "id": 3}
    row = prepare_sft_dataset(_ds([{"conversations": sharegpt}]), tok, 64)[0]
    assert row["input_ids"] == tok.apply_chat_template(CHAT[:2], tokenize=True, return_dict=True)["input_ids"]
    seen = prepare_sft_dataset(
        _ds([{"conversations": sharegpt}]), tok, 64, formatting_func=lambda r: str(sorted(r))
    )
    assert tok.decode(seen[0]["input_ids"]) == "['conversations']<|endoftext|>"  # the row as given


def test_iterable_dataset_is_prepared_lazily(tok):
    stream = _ds([{"text": "hello"}, {"text": "the cat"}]).to_iterable_dataset()
    out = prepare_sft_dataset(stream, tok, 64, num_proc=4)  # num_proc is not passed to an iterable's map
    assert isinstance(out, datasets.IterableDataset)
    assert [r["input_ids"] for r in out] == [_ids(tok, t) + [tok.eos_token_id] for t in ("hello", "the cat")]


def test_chat_template_path_from_a_file_or_a_tokenizer_folder(tmp_path):
    tok = tiny_tokenizer()
    jinja = tmp_path / "chat.jinja"
    jinja.write_text(GENERATION_CHAT_TEMPLATE)
    assert apply_chat_template_path(tok, str(jinja)).chat_template == GENERATION_CHAT_TEMPLATE
    source = tiny_tokenizer()
    source.chat_template = "{{ messages[0]['content'] }}"
    source.save_pretrained(tmp_path / "other")
    assert apply_chat_template_path(tok, tmp_path / "other").chat_template == "{{ messages[0]['content'] }}"
    assert apply_chat_template_path(tok, None).chat_template == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="chat_template_path='.*nope.j2' must be a .jinja/.j2 file"):
        apply_chat_template_path(tok, str(tmp_path / "nope.j2"))
    source.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    source.save_pretrained(tmp_path / "more")
    with pytest.raises(ValueError, match=r"special tokens \['<\|tool\|>'\] are not in"):
        apply_chat_template_path(tok, tmp_path / "more", "SFTTrainer")


def test_tokenised_rows_get_labels_from_their_masks_and_are_cut(tok):
    masked = {"input_ids": [1, 2, 3, 4], "assistant_masks": [0, 0, 1, 1], "completion_mask": [1, 1, 1, 0]}
    labelled = {"input_ids": [5, 6, 7], "labels": [5, -100, 7], "assistant_masks": [0, 0, 0]}
    # both masks apply (only token 3 has 1 in both); with completion_only_loss=False only assistant_masks
    assert prepare_sft_dataset(_ds([masked]), tok, None, completion_only_loss=None)[0]["labels"] == [
        -100,
        -100,
        3,
        -100,
    ]
    off = prepare_sft_dataset(_ds([masked]), tok, None, completion_only_loss=False)[0]
    assert off["labels"] == [-100, -100, 3, 4]
    assert prepare_sft_dataset(_ds([labelled]), tok, None)[0]["labels"] == [5, -100, 7]  # given labels win
    # max length 2 (keep_start): [1, 2] keeps no trained token, so the row is dropped and none is left
    with pytest.raises(ValueError, match="no trained token"):
        prepare_sft_dataset(_ds([masked]), tok, 2, completion_only_loss=False)
    assert prepare_sft_dataset(_ds([labelled]), tok, 2)[:] == {"input_ids": [[5, 6]], "labels": [[5, -100]]}


def test_a_rows_chat_template_kwargs_reach_the_template(tok):
    tok.chat_template = (
        "{% for m in messages %}{{ m.role.upper() if shout else m.role }}: {{ m.content }}\n{% endfor %}"
    )
    rows = [{"messages": CHAT[:2], "chat_template_kwargs": {"shout": shout}} for shout in (True, False)]
    out = prepare_sft_dataset(_ds(rows), tok, 128)
    assert [tok.decode(r["input_ids"]) for r in out] == [
        "USER: hi\nASSISTANT: yo\n",
        "user: hi\nassistant: yo\n",
    ]
