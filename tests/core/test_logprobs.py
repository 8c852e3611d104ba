import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.core import entropy_from_logits, full_kl_from_logits, selective_log_softmax


def test_selective_log_softmax_hand_value():
    # logits (0, ln 3): softmax = (1/4, 3/4); token 1 -> ln 0.75, token 0 -> ln 0.25
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    out = selective_log_softmax(logits, torch.tensor([[1, 0]]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [None, 1, 5])
def test_selective_log_softmax_matches_naive(dtype, chunk_rows):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=g) * 4).to(dtype)
    index = torch.randint(0, 50, (3, 7), generator=g)
    out = selective_log_softmax(logits, index, chunk_rows=chunk_rows)
    assert out.dtype == torch.float32 and out.shape == (3, 7)
    naive = torch.empty(3, 7)
    for b in range(3):
        for t in range(7):
            naive[b, t] = torch.log_softmax(logits[b, t].double(), -1)[index[b, t]].float()
    torch.testing.assert_close(out, naive, rtol=1e-5, atol=1e-5)


def test_selective_log_softmax_gradient_and_shape_check():
    logits = torch.randn(2, 3, 4, requires_grad=True)
    index = torch.randint(0, 4, (2, 3))
    selective_log_softmax(logits, index, chunk_rows=2).sum().backward()
    # d/dlogits of log softmax at index = onehot - softmax; rows sum to 0
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(2, 3), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="index shape"):
        selective_log_softmax(logits, torch.zeros(2, 4, dtype=torch.long))


def test_entropy_hand_values():
    # uniform over 4 -> ln 4; one dominant logit -> ~0
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, 0.0, 0.0]]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[math.log(4.0), 0.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entropy_matches_naive(dtype):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(4, 5, 33, generator=g) * 3).to(dtype)
    out = entropy_from_logits(logits, chunk_rows=3)
    assert out.dtype == torch.float32
    naive = torch.empty(4, 5)
    for b in range(4):
        for t in range(5):
            p = torch.softmax(logits[b, t].double(), -1)
            naive[b, t] = -(p * p.log()).sum().float()
    torch.testing.assert_close(out, naive, rtol=1e-5, atol=1e-5)


def test_full_kl_hand_value_and_identity():
    # p = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2)
    p = torch.tensor([[[0.0, math.log(3.0)]]])
    q = torch.zeros(1, 1, 2)
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert full_kl_from_logits(p, q).item() == pytest.approx(expected, rel=1e-5)
    assert full_kl_from_logits(p, p).item() == pytest.approx(0.0, abs=1e-7)


class _LargestNewTensor(TorchDispatchMode):
    """The largest tensor any op creates (views share their base's storage and are not counted)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in inputs:
            self.largest = max(self.largest, out.numel())
        return out


@pytest.mark.parametrize("chunk_rows", [3, 16])
def test_sliced_logits_are_read_in_place_with_the_same_values_and_gradients(chunk_rows):
    # logits[:, :-1] (every position but the last, as the trainers slice them) cannot be flattened to one
    # view; chunks of it are read in place (3 rows of one sequence, or 2 sequences of 8 rows) instead of
    # copying all (B, T, V) of them: nothing larger than one chunk is made
    g = torch.Generator().manual_seed(3)
    full = torch.randn(4, 9, 60, generator=g, requires_grad=True)
    index = torch.randint(0, 60, (4, 8), generator=g)
    sliced = full[:, :-1]
    counter = _LargestNewTensor()
    with counter:
        logprobs = selective_log_softmax(sliced, index, chunk_rows=chunk_rows)
        entropy = entropy_from_logits(sliced, chunk_rows=chunk_rows)
    assert counter.largest <= chunk_rows * 60  # the old reshape copied all 4 x 8 x 60 logits
    copy = full.detach()[:, :-1].contiguous().requires_grad_()
    torch.testing.assert_close(
        logprobs, selective_log_softmax(copy, index, chunk_rows=chunk_rows), rtol=0, atol=0
    )
    torch.testing.assert_close(entropy, entropy_from_logits(copy, chunk_rows=chunk_rows), rtol=0, atol=0)
    (logprobs.sum() + entropy.sum()).backward()
    (
        selective_log_softmax(copy, index, chunk_rows=chunk_rows).sum() + entropy_from_logits(copy).sum()
    ).backward()
    torch.testing.assert_close(full.grad[:, :-1], copy.grad, rtol=0, atol=0)
    assert not full.grad[:, -1].any()


def test_sliced_logits_with_more_leading_dims_and_the_full_kl():
    # (2, 3, 5, V)[:, :, :-1] with 5-row chunks: split by the first dim, then by the second; the KL reads its
    # reference rows in the same chunks, in place too, whether one or both of its inputs are sliced
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, 30, generator=g)[:, :, :-1]
    ref = torch.randn(2, 3, 5, 30, generator=g)[:, :, :-1]
    index = torch.randint(0, 30, (2, 3, 4), generator=g)
    dense, dense_ref = logits.contiguous(), ref.contiguous()
    torch.testing.assert_close(
        selective_log_softmax(logits, index, chunk_rows=5),
        selective_log_softmax(dense, index),
        rtol=0,
        atol=0,
    )
    want = full_kl_from_logits(dense, dense_ref)
    for pair in ((logits, ref), (dense, ref), (logits, dense_ref)):
        counter = _LargestNewTensor()
        with counter:
            got = full_kl_from_logits(*pair, chunk_rows=5)
        assert counter.largest <= 5 * 30  # no copy of either input (2 x 3 x 4 x 30 logits)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
