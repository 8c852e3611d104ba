"""DataCollatorForLanguageModeling: labels, padding and padding-free position ids, checked by hand."""

from __future__ import annotations

import pytest
import torch

from rlhfkit import DataCollatorForLanguageModeling
from rlhfkit.data.language_modeling import restarting_positions

X = -100


def _lists(batch):
    return {k: v.tolist() for k, v in batch.items()}


def test_padded_labels_default_to_the_ids_and_padding_is_ignored():
    out = _lists(
        DataCollatorForLanguageModeling(pad_token_id=0)([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    )
    assert out == {
        "input_ids": [[1, 2, 3], [4, 5, 0]],
        "attention_mask": [[1, 1, 1], [1, 1, 0]],
        "labels": [[1, 2, 3], [4, 5, X]],
    }


def test_given_labels_are_kept_and_masks_turn_positions_off():
    collate = DataCollatorForLanguageModeling(pad_token_id=0)
    out = collate([{"input_ids": [1, 2, 3], "labels": [X, 2, 3]}, {"input_ids": [4, 5], "labels": [X, 5]}])
    assert out["labels"].tolist() == [[X, 2, 3], [X, 5, X]]
    # completion_mask 0 = prompt; assistant_masks 0 = not an assistant token; both apply together
    row = {"input_ids": [1, 2, 3, 4], "completion_mask": [0, 1, 1, 1], "assistant_masks": [1, 1, 0, 1]}
    assert collate([row])["labels"].tolist() == [[X, 2, X, 4]]
    off = DataCollatorForLanguageModeling(pad_token_id=0, completion_only_loss=False)
    assert off([row])["labels"].tolist() == [[1, 2, X, 4]]  # assistant_masks still apply


def test_padding_free_flattens_with_restarting_positions():
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    out = _lists(collate([{"input_ids": [1, 2, 3], "labels": [X, 2, 3]}, {"input_ids": [4, 5]}]))
    # one row; each example's first label is -100 (nothing before it in its own example)
    assert out == {
        "input_ids": [[1, 2, 3, 4, 5]],
        "labels": [[X, 2, 3, X, 5]],
        "position_ids": [[0, 1, 2, 0, 1]],
    }


def test_packed_rows_restart_positions_at_each_document():
    packed = {"input_ids": [1, 2, 3, 4, 5, 6], "seq_lengths": [2, 3, 1]}
    assert restarting_positions([2, 3, 1]) == [0, 1, 0, 1, 2, 0]
    free = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=4)
    out = _lists(free([packed, {"input_ids": [7], "seq_lengths": [1]}]))
    assert out["position_ids"] == [[0, 1, 0, 1, 2, 0, 0, 0]]  # 7 tokens padded to 8 with position 0
    assert out["labels"] == [[X, 2, X, 4, 5, X, X, X]]
    assert out["input_ids"] == [[1, 2, 3, 4, 5, 6, 7, 0]]
    padded = DataCollatorForLanguageModeling(pad_token_id=9, return_position_ids=True, pad_to_multiple_of=4)
    out = _lists(padded([packed, {"input_ids": [7, 8]}]))
    assert out["position_ids"] == [[0, 1, 0, 1, 2, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert out["input_ids"][1] == [7, 8, 9, 9, 9, 9, 9, 9] and out["attention_mask"][1] == [1, 1] + [0] * 6
    assert out["labels"][0] == [1, 2, 3, 4, 5, 6, X, X]  # padded layout: labels as given


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="return_tensors must be 'pt'"):
        DataCollatorForLanguageModeling(pad_token_id=0, return_tensors="np")
    with pytest.raises(TypeError, match="pad_token_id must be an int"):
        DataCollatorForLanguageModeling(pad_token_id=None)
    collate = DataCollatorForLanguageModeling(pad_token_id=0)
    with pytest.raises(ValueError, match="does not match input_ids"):
        collate([{"input_ids": [1, 2], "completion_mask": [1]}])
    with pytest.raises(ValueError, match=r"seq_lengths \[2, 2\] sum to 4, but the row has 3 input_ids"):
        collate([{"input_ids": [1, 2, 3], "seq_lengths": [2, 2]}])
    with pytest.raises(ValueError, match="'input_ids'"):
        collate([{"text": "x"}])
    assert collate([{"input_ids": torch.tensor([3, 4])}])["input_ids"].tolist() == [[3, 4]]


def test_position_ids_from_packed_seq_lengths_restart_per_document():
    got = DataCollatorForLanguageModeling.get_position_ids_from_packed_seq_lengths([[3, 2], [4], [1, 1, 2]])
    # row 0: documents of 3 and 2 tokens -> 0 1 2 | 0 1; row 1: one document; row 2: 0 | 0 | 0 1
    assert [t.tolist() for t in got] == [[0, 1, 2, 0, 1], [0, 1, 2, 3], [0, 0, 0, 1]]
    assert all(t.dtype == torch.long for t in got)
