import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.core import first_true_indices, masked_mean, masked_var, masked_whiten, truncate_at_stop


def test_masked_mean_ignores_masked_values():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # real values 1, 2, 3 -> mean 2
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    # per row: (1+2)/2 = 1.5 and 3/1 = 3
    torch.testing.assert_close(masked_mean(values, mask, dim=1), torch.tensor([1.5, 3.0]))


def test_masked_var_biased_and_unbiased():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 99.0])
    mask = torch.tensor([True, True, True, True, False])
    # mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5 -> population 5/4, sample 5/3
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(1.25)
    assert masked_var(values, mask).item() == pytest.approx(5 / 3)


def test_masked_var_unbiased_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(torch.tensor([1.0, 2.0]), torch.tensor([True, False]))


def test_masked_mean_shape_mismatch():
    with pytest.raises(ValueError, match="mask shape"):
        masked_mean(torch.zeros(2, 3), torch.ones(2, 2))


def test_masked_whiten_hand_values():
    values = torch.tensor([1.0, 3.0, 50.0])
    mask = torch.tensor([True, True, False])
    # mean 2, unbiased var ((1)^2 + (1)^2) / 1 = 2 -> whitened -1/sqrt 2, +1/sqrt 2
    out = masked_whiten(values, mask)
    torch.testing.assert_close(out[:2], torch.tensor([-(0.5**0.5), 0.5**0.5]), rtol=1e-5, atol=1e-5)
    # without shifting, the mean 2 is added back
    out = masked_whiten(values, mask, shift_mean=False)
    torch.testing.assert_close(out[:2], torch.tensor([2 - 0.5**0.5, 2 + 0.5**0.5]), rtol=1e-5, atol=1e-5)


def test_masked_whiten_without_mask_uses_every_entry():
    # mean 3, sample std 2 -> (-1, 0, 1): the batch standardisation of RLOO and DDPO
    torch.testing.assert_close(
        masked_whiten(torch.tensor([1.0, 3.0, 5.0]), None), torch.tensor([-1.0, 0.0, 1.0])
    )
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(torch.tensor([1.0]), None)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-100, 100), min_size=3, max_size=30).filter(lambda xs: max(xs) - min(xs) > 1e-2),
    st.integers(0, 5),
)
def test_masked_whiten_moments_property(xs, n_pad):
    values = torch.tensor(xs + [1e6] * n_pad, dtype=torch.float64)
    mask = torch.tensor([True] * len(xs) + [False] * n_pad)
    out = masked_whiten(values, mask)
    assert masked_mean(out, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(out, mask).item() ** 0.5 == pytest.approx(1.0, rel=1e-4)


def test_first_true_indices():
    bools = torch.tensor([[False, True, True], [False, False, False], [True, False, False]])
    # first True at 1; none -> length 3; first at 0
    assert first_true_indices(bools).tolist() == [1, 3, 0]
    with pytest.raises(TypeError, match="bool"):
        first_true_indices(torch.ones(2, 2))


def test_truncate_at_stop_keeps_first_stop_and_pads_rest():
    stop, pad = 9, 0
    responses = torch.tensor([[5, 9, 6, 9], [5, 6, 7, 8], [9, 1, 2, 3]])
    out, mask = truncate_at_stop(responses, stop, pad)
    assert out.tolist() == [[5, 9, 0, 0], [5, 6, 7, 8], [9, 0, 0, 0]]
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert responses[0, 2] == 6  # input is not modified in place


def test_truncate_without_stop_token_masks_from_first_pad():
    responses = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8]])
    out, mask = truncate_at_stop(responses, None, pad_token_id=0)
    assert torch.equal(out, responses)
    assert mask.tolist() == [[True, True, False, False], [True] * 4]


def test_truncate_naive_loop_agreement():
    g = torch.Generator().manual_seed(1)
    responses = torch.randint(0, 4, (16, 7), generator=g)
    out, mask = truncate_at_stop(responses, stop_token_id=3, pad_token_id=-1)
    for row, (o, m) in enumerate(zip(out.tolist(), mask.tolist(), strict=True)):
        seen_stop = False
        for t, token in enumerate(responses[row].tolist()):
            assert m[t] == (not seen_stop)
            assert o[t] == (-1 if seen_stop else token)
            seen_stop = seen_stop or token == 3
