"""Dataset preparation: tokenisation layouts, truncation rules and clear errors for bad datasets."""

from __future__ import annotations

import datasets
import pytest

from rlhfkit.data.preference import prepare_dpo_dataset, prepare_reward_dataset, truncate_dpo_row
from rlhfkit.data.preparation import prepare_sft_dataset
from rlhfkit.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


def trained_mask(row: dict) -> list[int]:
    """1 where the prepared row's labels train (not -100)."""
    return [int(t != -100) for t in row["labels"]]


def _ds(rows):
    return datasets.Dataset.from_list(rows)


# --- SFT ------------------------------------------------------------------------------------------


def test_sft_text_gets_eos_and_truncation(tok):
    out = prepare_sft_dataset(_ds([{"text": "hello world", "other": 1}]), tok, max_seq_length=64)
    ids = tok("hello world")["input_ids"] + [tok.eos_token_id]
    assert out.column_names == ["input_ids", "labels"]  # TRL 1.x's prepared columns
    assert out[0]["input_ids"] == ids and trained_mask(out[0]) == [1] * len(ids)
    short = prepare_sft_dataset(_ds([{"text": "hello world"}]), tok, max_seq_length=2)
    assert short[0]["input_ids"] == ids[:2]


def test_sft_completion_only_masks_the_prompt(tok):
    out = prepare_sft_dataset(
        _ds([{"prompt": "Q: hi ", "completion": "fine thanks"}]), tok, 64, completion_only_loss=True
    )
    p = tok("Q: hi ")["input_ids"]
    c = tok("fine thanks", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out[0]["input_ids"] == p + c
    assert trained_mask(out[0]) == [0] * len(p) + [1] * len(c)


def test_sft_chat_completion_only_trains_last_assistant_turn(tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    out = prepare_sft_dataset(_ds([{"messages": messages}]), tok, 128, completion_only_loss=True)
    full = tok.apply_chat_template(messages, tokenize=False)
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    trained = [t for t, m in zip(out[0]["input_ids"], trained_mask(out[0])) if m]
    assert tok.decode(trained) == full[len(prompt) :]  # exactly the assistant's rendered reply
    plain = prepare_sft_dataset(_ds([{"messages": messages}]), tok, 128)
    assert tok.decode(plain[0]["input_ids"]) == full  # template already ends with EOS: no second one


def test_sft_formatting_func(tok):
    out = prepare_sft_dataset(
        _ds([{"q": "a", "a": "b"}]), tok, 64, formatting_func=lambda r: f"{r['q']}={r['a']}"
    )
    assert out[0]["input_ids"] == tok("a=b")["input_ids"] + [tok.eos_token_id]


def test_sft_bad_datasets(tok):
    with pytest.raises(ValueError, match="needs the columns"):
        prepare_sft_dataset(_ds([{"body": "x"}]), tok, 64)
    with pytest.raises(ValueError, match="empty"):
        prepare_sft_dataset(_ds([{"text": "x"}]).select([]), tok, 64)
    with pytest.raises(ValueError, match="completion_only_loss"):
        prepare_sft_dataset(_ds([{"text": "x"}]), tok, 64, completion_only_loss=True)


# --- reward ---------------------------------------------------------------------------------------


def test_reward_raw_text_tokenises_prompt_plus_response(tok):
    out, stats = prepare_reward_dataset(
        _ds([{"prompt": "Q: ", "chosen": "yes", "rejected": "no", "margin": 1.0}]), tok, 64
    )
    assert out[0]["chosen_ids"] == tok("Q: yes")["input_ids"]
    assert out[0]["rejected_ids"] == tok("Q: no")["input_ids"]
    assert out[0]["margin"] == 1.0 and stats == {"dropped": 0, "truncated": 0}


def test_reward_chat_pairs_use_the_template(tok):
    prompt = [{"role": "user", "content": "hi"}]
    row = {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": "hello"}],
        "rejected": [{"role": "assistant", "content": "go away"}],
    }
    out, _ = prepare_reward_dataset(_ds([row]), tok, 256)
    expected = tok(tok.apply_chat_template(prompt + row["chosen"], tokenize=False))["input_ids"]
    assert out[0]["chosen_ids"] == expected


def test_reward_overlong_pairs_dropped_or_truncated(tok):
    rows = [{"chosen": "a b c d e f g h i j k l", "rejected": "z"}, {"chosen": "ok", "rejected": "no"}]
    n_long = len(tok(rows[0]["chosen"])["input_ids"])
    assert n_long > 4
    dropped, stats = prepare_reward_dataset(_ds(rows), tok, 4, "drop")
    assert len(dropped) == 1 and stats == {"dropped": 1, "truncated": 0}
    cut, stats = prepare_reward_dataset(_ds(rows), tok, 4, "truncate")
    assert len(cut) == 2 and stats == {"dropped": 0, "truncated": 1}
    assert len(cut[0]["chosen_ids"]) == 4 and len(cut[0]["rejected_ids"]) == 1
    with pytest.raises(ValueError, match="every pair"):
        prepare_reward_dataset(_ds(rows[:1]), tok, 4, "drop")


def test_reward_bad_datasets(tok):
    with pytest.raises(ValueError, match="needs the columns"):
        prepare_reward_dataset(_ds([{"good": "a", "bad": "b"}]), tok, 64)
    with pytest.raises(ValueError, match="empty"):
        prepare_reward_dataset(_ds([{"chosen": "a", "rejected": "b"}]).select([]), tok, 64)
    with pytest.raises(ValueError, match="identical in every one"):
        prepare_reward_dataset(_ds([{"chosen": "a", "rejected": "a"}] * 3), tok, 64)


# --- DPO ------------------------------------------------------------------------------------------


def test_truncate_dpo_row_hand_checked():
    p, c, r = [1, 2, 3, 4], [5, 6, 7], [8]
    # 4 + 3 > 6: prompt first cut to 2 tokens (keep_end keeps the latest), then 4 of room is enough
    assert truncate_dpo_row(p, c, r, 6, 2, "keep_end") == ([3, 4], [5, 6, 7], [8])
    assert truncate_dpo_row(p, c, r, 6, 2, "keep_start") == ([1, 2], [5, 6, 7], [8])
    # max_length 4: prompt -> 2 tokens, responses cut to the 2 remaining
    assert truncate_dpo_row(p, c, r, 4, 2, "keep_end") == ([3, 4], [5, 6], [8])
    # fits: untouched
    assert truncate_dpo_row(p, c, r, 7, 2, "keep_end") == (p, c, r)


def test_dpo_text_layout(tok):
    out = prepare_dpo_dataset(_ds([{"prompt": "Q: ", "chosen": "yes", "rejected": "no"}]), tok, 64, 16)
    eos = tok.eos_token_id
    assert out[0]["prompt_ids"] == tok("Q: ")["input_ids"]
    assert out[0]["chosen_ids"] == tok("yes", add_special_tokens=False)["input_ids"] + [eos]
    assert out[0]["rejected_ids"] == tok("no", add_special_tokens=False)["input_ids"] + [eos]


def test_dpo_chat_with_implicit_prompt(tok):
    user = {"role": "user", "content": "hi"}
    row = {
        "chosen": [user, {"role": "assistant", "content": "hello"}],
        "rejected": [user, {"role": "assistant", "content": "bye"}],
    }
    out = prepare_dpo_dataset(_ds([row]), tok, 256, 64)
    prompt_text = tok.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
    assert tok.decode(out[0]["prompt_ids"]) == prompt_text
    full = tok.apply_chat_template(row["chosen"], tokenize=False)
    assert tok.decode(out[0]["prompt_ids"] + out[0]["chosen_ids"]) == full


def test_dpo_bad_datasets(tok):
    # (plain chosen/rejected without a prompt column is TRL 1.x's implicit prompt: tests/data/test_preference)
    with pytest.raises(ValueError, match="needs the columns"):
        prepare_dpo_dataset(_ds([{"prompt": "a", "answer": "b"}]), tok, 64, 16)
    with pytest.raises(ValueError, match="identical in every one"):
        prepare_dpo_dataset(_ds([{"prompt": "q", "chosen": "a", "rejected": "a"}] * 2), tok, 64, 16)
    with pytest.raises(ValueError, match="empty"):
        prepare_dpo_dataset(_ds([{"prompt": "q", "chosen": "a", "rejected": "b"}]).select([]), tok, 64, 16)
