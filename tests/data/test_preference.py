"""TRL 1.x's preference data forms: implicit prompts, tokenised columns, iterable datasets, tool calls,
and `DataCollatorForPreference`, checked against hand-written values."""

from __future__ import annotations

import datasets
import pytest
import torch

from rlhfkit.data.collators import DataCollatorForPreference
from rlhfkit.data.preference import (
    OLD_DPO_TOKENISED,
    extract_prompt,
    prepare_dpo_dataset,
    prepare_reward_dataset,
)
from rlhfkit.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(padding_side="right")


USER = {"role": "user", "content": "What color is the sky?"}


def test_extract_prompt_text_keeps_the_space_with_the_responses():
    got = extract_prompt({"chosen": "The sky is blue.", "rejected": "The sky is green."})
    assert got == {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}


def test_extract_prompt_text_without_a_space_at_the_split():
    # shared "ab", they differ at the third character; no space to move
    assert extract_prompt({"chosen": "abc", "rejected": "abd"}) == {
        "prompt": "ab",
        "chosen": "c",
        "rejected": "d",
    }


def test_extract_prompt_chats_share_their_first_messages():
    turn = [USER, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Sure?"}]
    chosen = turn + [{"role": "assistant", "content": "Yes."}]
    rejected = turn + [{"role": "assistant", "content": "No."}]
    got = extract_prompt({"chosen": chosen, "rejected": rejected})
    assert got == {"prompt": turn, "chosen": chosen[3:], "rejected": rejected[3:]}
    # the shared part may be shorter than "all but the last message"
    short = [USER, {"role": "assistant", "content": "Green."}]
    got = extract_prompt({"chosen": chosen, "rejected": short})
    assert got["prompt"] == [USER] and got["rejected"] == short[1:] and got["chosen"] == chosen[1:]


def test_implicit_text_prompt_tokenises_like_an_explicit_one(tok):
    implicit = prepare_dpo_dataset(
        datasets.Dataset.from_list([{"chosen": "The sky is blue.", "rejected": "The sky is green."}]),
        tok,
        64,
        32,
    )
    explicit = prepare_dpo_dataset(
        datasets.Dataset.from_list([{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}]),
        tok,
        64,
        32,
    )
    assert implicit[0] == explicit[0]


@pytest.mark.parametrize("names", [("prompt_ids", "chosen_ids", "rejected_ids"), OLD_DPO_TOKENISED])
def test_tokenised_columns_pass_through_and_are_cut(tok, names):
    """TRL 1.x's names stay; the earlier prompt_input_ids / chosen_input_ids / ... are renamed to them."""
    rows = [dict(zip(names, ([5, 6, 7], [8, 9, 10], [11])), extra="x")]
    out = prepare_dpo_dataset(datasets.Dataset.from_list(rows), tok, max_length=None, max_prompt_length=None)
    assert out[0] == {"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9, 10], "rejected_ids": [11]}
    # max_length 5, prompt <= 2 (keep_end): prompt [6, 7], responses cut to the 3 remaining tokens
    cut = prepare_dpo_dataset(datasets.Dataset.from_list(rows), None, max_length=5, max_prompt_length=2)
    assert cut[0]["prompt_ids"] == [6, 7] and cut[0]["chosen_ids"] == [8, 9, 10]


def test_iterable_dataset_is_prepared_lazily(tok):
    rows = [{"prompt": "Q: ", "chosen": "yes", "rejected": "no"}] * 3
    expected = prepare_dpo_dataset(datasets.Dataset.from_list(rows), tok, 64, 16)[0]
    lazy = prepare_dpo_dataset(
        datasets.Dataset.from_list(rows).to_iterable_dataset(), tok, 64, 16, num_proc=2
    )
    assert isinstance(lazy, datasets.IterableDataset)
    got = list(lazy)
    assert len(got) == 3 and {k: got[0][k] for k in expected} == expected


TOOL_TEMPLATE = (
    "{% if tools %}<|system|>\ntools:{% for t in tools %} {{ t['name'] }}{% endfor %}"
    "<|endoftext|>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}call {{ c['function']['name'] }}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_tool_calls_and_tools_column_render_through_the_chat_template():
    tok = tiny_tokenizer(padding_side="right")
    tok.chat_template = TOOL_TEMPLATE
    row = {
        "prompt": [USER],
        "chosen": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "sky"}}]}],
        "rejected": [{"role": "assistant", "content": "Green."}],
        "tools": '[{"name": "sky"}]',  # TRL 1.x also accepts the schemas as a JSON string
    }
    out = prepare_dpo_dataset(datasets.Dataset.from_list([row]), tok, 256, 128)
    prompt = tok.decode(out[0]["prompt_ids"])
    assert prompt.startswith("<|system|>\ntools: sky")
    assert tok.decode(out[0]["chosen_ids"]).startswith("call sky")
    reward, _ = prepare_reward_dataset(datasets.Dataset.from_list([row]), tok, None)
    assert tok.decode(reward[0]["chosen_ids"]).startswith("<|system|>\ntools: sky")


def test_reward_trl1_tokenised_columns():
    rows = [{"chosen_ids": [1, 2, 3], "rejected_ids": [4], "margin": 0.5, "extra": "x"}]
    out, _ = prepare_reward_dataset(datasets.Dataset.from_list(rows), None, None)
    assert out[0] == {"chosen_ids": [1, 2, 3], "rejected_ids": [4], "margin": 0.5}


def test_reward_trl0_tokenised_columns_keep_only_real_tokens():
    """The seeds' input_ids_chosen + attention_mask_chosen: a pre-padded row loses its padding (mask 0)."""
    rows = [
        {
            "input_ids_chosen": [1, 2, 3, 0],
            "attention_mask_chosen": [1, 1, 1, 0],
            "input_ids_rejected": [0, 0, 4, 5],
            "attention_mask_rejected": [0, 0, 1, 1],
        }
    ]
    out, _ = prepare_reward_dataset(datasets.Dataset.from_list(rows), None, None)
    assert out[0] == {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5]}


def test_reward_interim_tokenised_columns_are_renamed_with_a_future_warning():
    rows = [{"chosen_input_ids": [1, 2], "rejected_input_ids": [3]}]
    with pytest.warns(FutureWarning, match="chosen_input_ids"):
        out, _ = prepare_reward_dataset(datasets.Dataset.from_list(rows), None, None)
    assert out[0] == {"chosen_ids": [1, 2], "rejected_ids": [3]}


# --- DataCollatorForPreference --------------------------------------------------------------------------

DPO_EXAMPLES = [
    {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]},
    {"prompt_ids": [7, 8], "chosen_ids": [9], "rejected_ids": [10, 11]},
]


def test_collator_dpo_form():
    batch = DataCollatorForPreference(pad_token_id=0)(DPO_EXAMPLES)
    # rows: prompt+chosen of each example, then prompt+rejected of each
    assert batch["input_ids"].tolist() == [
        [1, 2, 3, 4, 5],
        [7, 8, 9, 0, 0],
        [1, 2, 3, 6, 0],
        [7, 8, 10, 11, 0],
    ]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
    ]
    assert batch["completion_mask"].tolist() == [
        [0, 0, 0, 1, 1],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 1, 1, 0],
    ]


def test_collator_truncates_each_sequence_and_rounds_the_width():
    start = DataCollatorForPreference(pad_token_id=0, max_length=3, pad_to_multiple_of=4)(DPO_EXAMPLES)
    assert start["input_ids"].tolist() == [[1, 2, 3, 0], [7, 8, 9, 0], [1, 2, 3, 0], [7, 8, 10, 0]]
    assert start["completion_mask"][0].tolist() == [0, 0, 0, 0]  # the response was cut off entirely
    end = DataCollatorForPreference(pad_token_id=0, max_length=3, truncation_mode="keep_end")(DPO_EXAMPLES)
    assert end["input_ids"].tolist() == [[3, 4, 5], [7, 8, 9], [2, 3, 6], [8, 10, 11]]
    assert end["completion_mask"].tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 1], [0, 1, 1]]


def test_collator_passes_reference_logps_and_reads_prepared_columns():
    ids = {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}
    rows = [{**ids, "ref_chosen_logps": -1.0, "ref_rejected_logps": -2.0}]
    batch = DataCollatorForPreference(pad_token_id=0)(rows)
    assert batch["input_ids"].tolist() == [[1, 2], [1, 3]]
    assert torch.equal(batch["ref_chosen_logps"], torch.tensor([-1.0]))
    assert torch.equal(batch["ref_rejected_logps"], torch.tensor([-2.0]))


def test_collator_reward_form_with_margin():
    examples = [
        {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5], "margin": 0.5},
        {"chosen_ids": [6, 7], "rejected_ids": [8], "margin": 0.0},
    ]
    batch = DataCollatorForPreference(pad_token_id=0)(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [6, 7, 0], [4, 5, 0], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]]
    assert torch.equal(batch["margin"], torch.tensor([0.5, 0.0]))
    assert "completion_mask" not in batch


def test_collator_bad_arguments():
    with pytest.raises(ValueError, match="truncation_mode must be 'keep_start' or 'keep_end'"):
        DataCollatorForPreference(pad_token_id=0, truncation_mode="middle")
    with pytest.raises(ValueError, match="return_tensors must be 'pt'"):
        DataCollatorForPreference(pad_token_id=0, return_tensors="np")
    with pytest.raises(ValueError, match="'chosen_ids'"):
        DataCollatorForPreference(pad_token_id=0)([{"chosen": "a", "rejected": "b"}])


SHOUT_TEMPLATE = (
    "{% for m in messages %}{{ m.role.upper() if shout else m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT: ' if shout else 'assistant: ' }}{% endif %}"
)


def test_a_rows_chat_template_kwargs_reach_the_template():
    """TRL 1.x's per-row `chat_template_kwargs` column: template variables for that row only."""
    tok = tiny_tokenizer(padding_side="right")
    tok.chat_template = SHOUT_TEMPLATE
    rows = [
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "assistant", "content": "yes"}],
            "rejected": [{"role": "assistant", "content": "no"}],
            "chat_template_kwargs": {"shout": shout},
        }
        for shout in (True, False)
    ]
    dpo = prepare_dpo_dataset(datasets.Dataset.from_list(rows), tok, 256, 128)
    assert [tok.decode(r["prompt_ids"]) for r in dpo] == ["USER: hi\nASSISTANT: ", "user: hi\nassistant: "]
    reward, _ = prepare_reward_dataset(datasets.Dataset.from_list(rows), tok, None)
    assert tok.decode(reward[0]["chosen_ids"]) == "USER: hi\nASSISTANT: yes\n"
    assert tok.decode(reward[1]["chosen_ids"]) == "user: hi\nassistant: yes\n"
