"""Collators: padding values, sides, masks and labels checked against hand-written tensors."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.data.collators import (
    DPODataCollatorWithPadding,
    RewardDataCollatorWithPadding,
    pad_sequences,
)


class _Tok:
    pad_token_id = 9
    eos_token_id = 8


def test_pad_sequences_sides_and_multiple():
    assert pad_sequences([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_sequences([[1, 2, 3], [4]], 0, "left").tolist() == [[1, 2, 3], [0, 0, 4]]
    # width 3 rounded up to a multiple of 4
    assert pad_sequences([[1, 2, 3]], 7, pad_to_multiple_of=4).tolist() == [[1, 2, 3, 7]]
    with pytest.raises(ValueError, match="side"):
        pad_sequences([[1]], 0, "middle")


def test_reward_collator_pads_both_sides_and_keeps_margin():
    features = [
        {
            "input_ids_chosen": [1, 2],
            "attention_mask_chosen": [1, 1],
            "input_ids_rejected": [3],
            "attention_mask_rejected": [1],
            "margin": 0.5,
        },
        {
            "input_ids_chosen": [4],
            "attention_mask_chosen": [1],
            "input_ids_rejected": [5, 6, 7],
            "attention_mask_rejected": [1, 1, 1],
            "margin": 2,
        },
    ]
    batch = RewardDataCollatorWithPadding(_Tok())(features)
    assert batch["input_ids_chosen"].tolist() == [[1, 2], [4, 9]]
    assert batch["attention_mask_chosen"].tolist() == [[1, 1], [1, 0]]
    assert batch["input_ids_rejected"].tolist() == [[3, 9, 9], [5, 6, 7]]
    assert batch["attention_mask_rejected"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert torch.equal(batch["margin"], torch.tensor([0.5, 2.0]))
    assert batch["return_loss"] is True


def test_reward_collator_reads_prepared_rows():
    """RewardTrainer's prepared rows (chosen_ids / rejected_ids): every token is real."""
    features = [{"chosen_ids": [1, 2], "rejected_ids": [3]}, {"chosen_ids": [4], "rejected_ids": [5, 6, 7]}]
    batch = RewardDataCollatorWithPadding(_Tok())(features)
    assert batch["input_ids_chosen"].tolist() == [[1, 2], [4, 9]]
    assert batch["attention_mask_chosen"].tolist() == [[1, 1], [1, 0]]
    assert batch["input_ids_rejected"].tolist() == [[3, 9, 9], [5, 6, 7]]
    assert batch["attention_mask_rejected"].tolist() == [[1, 0, 0], [1, 1, 1]]


def test_reward_collator_names_missing_columns():
    with pytest.raises(
        ValueError, match="'chosen_ids' \\(or 'input_ids_chosen' and 'attention_mask_chosen'\\)"
    ):
        RewardDataCollatorWithPadding(_Tok())([{"chosen": "a", "rejected": "b"}])


def test_dpo_collator_layout():
    features = [
        {"prompt_ids": [1, 2], "chosen_ids": [3, 8], "rejected_ids": [4, 5, 8]},
        {"prompt_ids": [6], "chosen_ids": [7, 8], "rejected_ids": [8]},
    ]
    batch = DPODataCollatorWithPadding(pad_token_id=0, label_pad_token_id=-100)(features)
    # prompts are left-padded for generation
    assert batch["prompt_input_ids"].tolist() == [[1, 2], [0, 6]]
    assert batch["prompt_attention_mask"].tolist() == [[1, 1], [0, 1]]
    # prompt + response, right-padded; labels hide the prompt and the padding
    assert batch["chosen_input_ids"].tolist() == [[1, 2, 3, 8], [6, 7, 8, 0]]
    assert batch["chosen_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["chosen_labels"].tolist() == [[-100, -100, 3, 8], [-100, 7, 8, -100]]
    assert batch["rejected_input_ids"].tolist() == [[1, 2, 4, 5, 8], [6, 8, 0, 0, 0]]
    assert batch["rejected_labels"].tolist() == [[-100, -100, 4, 5, 8], [-100, 8, -100, -100, -100]]


def test_dpo_collator_passes_reference_logps():
    features = [
        {
            "prompt_ids": [1],
            "chosen_ids": [2],
            "rejected_ids": [3],
            "reference_chosen_logps": -1.5,
            "reference_rejected_logps": -2.0,
        },
    ]
    batch = DPODataCollatorWithPadding()(features)
    assert batch["reference_chosen_logps"].tolist() == [-1.5]
    assert batch["reference_rejected_logps"].tolist() == [-2.0]


def test_cat_padded_right_pads_to_the_wider_batch():
    from rlhfkit.data.collators import cat_padded

    a, b = torch.tensor([[1, 2, 3]]), torch.tensor([[4], [5]])
    assert cat_padded(a, b, 0).tolist() == [[1, 2, 3], [4, 0, 0], [5, 0, 0]]
