"""RolloutBatch: padding, the two masks, row indexing with column trimming, minibatches."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rollout.batch import RolloutBatch


def _batch() -> RolloutBatch:
    # queries of lengths 2, 1, 3 (left-padded to 3); responses of lengths 1, 3, 2 (right-padded to 3)
    queries = [torch.tensor([5, 6]), torch.tensor([7]), torch.tensor([1, 2, 3])]
    responses = [torch.tensor([9]), torch.tensor([4, 4, 4]), torch.tensor([8, 8])]
    loss_masks = [torch.tensor([1]), torch.tensor([1, 0, 1]), torch.tensor([1, 1])]
    return RolloutBatch.from_sequences(queries, responses, pad_token_id=0, loss_masks=loss_masks)


def test_from_sequences_pads_and_keeps_masks_apart():
    b = _batch()
    assert b.query_ids.tolist() == [[0, 5, 6], [0, 0, 7], [1, 2, 3]]
    assert b.responses.tolist() == [[9, 0, 0], [4, 4, 4], [8, 8, 0]]
    assert b.response_mask.tolist() == [[True, False, False], [True, True, True], [True, True, False]]
    # the loss mask removes the middle token of row 1 and never marks padding
    assert b.loss_mask.tolist() == [[True, False, False], [True, False, True], [True, True, False]]
    assert len(b) == 3


def test_indexing_trims_columns_the_rows_do_not_use():
    b = _batch().replace(scores=torch.tensor([1.0, 2.0, 3.0]), logprobs=torch.arange(9.0).view(3, 3))
    rows = b[torch.tensor([0])]
    # row 0: query [5, 6] needs columns 1..2, response [9] needs column 0 only
    assert rows.query_ids.tolist() == [[5, 6]]
    assert rows.responses.tolist() == [[9]]
    assert rows.logprobs.tolist() == [[0.0]]
    assert rows.scores.tolist() == [1.0]
    both = b[[0, 2]]
    assert both.query_ids.tolist() == [[0, 5, 6], [1, 2, 3]]
    assert both.responses.shape == (2, 2)


def test_replace_checks_rows():
    b = _batch()
    with pytest.raises(ValueError, match="scores has 2 rows"):
        b.replace(scores=torch.zeros(2))
    with pytest.raises(ValueError, match="must match"):
        RolloutBatch(b.query_ids, b.query_mask, b.responses, b.response_mask[:, :2], b.loss_mask)


def test_minibatches_cover_every_row_once_in_order():
    b = _batch().replace(scores=torch.tensor([1.0, 2.0, 3.0]))
    order = torch.tensor([2, 0, 1])
    seen = [(idx.tolist(), mb.scores.tolist()) for idx, mb in b.minibatches(2, order)]
    assert seen == [([2, 0], [3.0, 1.0]), ([1], [2.0])]
    with pytest.raises(ValueError, match="positive integer"):
        next(b.minibatches(0))


def test_forward_batch_equals_row_by_row_forward_and_zeroes_untrained_tokens():
    from rlhfkit.rollout import forward_response
    from rlhfkit.rollout.scoring import forward_batch
    from rlhfkit.testing import tiny_value_head_model

    model = tiny_value_head_model("llama", summary_dropout_prob=0.0).eval()
    batch = _batch()
    out = forward_batch(model, batch, chunk_size=2, with_values=True)
    assert out.logprobs.shape == out.values.shape == (3, 3)
    for i in range(3):
        row = batch[[i]]
        single = forward_response(
            model, row.query_ids, row.query_mask, row.responses, row.response_mask, with_values=True
        )
        n = row.responses.shape[1]
        trained = batch.loss_mask[i, :n]
        torch.testing.assert_close(
            out.logprobs[i, :n][trained], single.logprobs[0][trained], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(
            out.values[i, :n][trained], single.values[0][trained], atol=1e-5, rtol=1e-5
        )
    assert (out.logprobs[~batch.loss_mask] == 0).all() and (out.values[~batch.loss_mask] == 0).all()
