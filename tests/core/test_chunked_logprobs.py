import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.core.chunked_logprobs import chunked_token_logprobs
from rlhfkit.core.logprobs import entropy_from_logits, selective_log_softmax


def _straightforward(hidden, weight, bias, targets, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias) / temperature
    return selective_log_softmax(logits, targets), entropy_from_logits(logits)


def test_hand_value_and_entropy():
    # one hidden unit h = 1, weight rows (0, ln 3): logits (0, ln 3), softmax (1/4, 3/4)
    hidden = torch.ones(2, 1)
    weight = torch.tensor([[0.0], [math.log(3.0)]])
    logprobs, entropy = chunked_token_logprobs(hidden, weight, None, torch.tensor([1, 0]), with_entropy=True)
    assert logprobs.dtype == torch.float32 and entropy.shape == (2,)
    torch.testing.assert_close(logprobs, torch.tensor([math.log(0.75), math.log(0.25)]))
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    expected_h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy, torch.full((2,), expected_h))
    # temperature 2 halves the logits: (0, ln 3 / 2) -> p(1) = sqrt 3 / (1 + sqrt 3)
    halved = chunked_token_logprobs(hidden, weight, None, torch.tensor([1, 0]), temperature=2.0)
    torch.testing.assert_close(halved[0], torch.tensor(math.log(math.sqrt(3) / (1 + math.sqrt(3)))))


@pytest.mark.parametrize("chunk_rows", [None, 1, 5])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_straightforward(chunk_rows, with_bias, temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 50, (3, 7), generator=g)
    # weights for a loss that uses both outputs, so both backward terms are exercised
    a, b = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    params = [hidden, weight] + ([bias] if with_bias else [])

    logprobs, entropy = chunked_token_logprobs(
        hidden, weight, bias, targets, temperature=temperature, chunk_rows=chunk_rows, with_entropy=True
    )
    grads = torch.autograd.grad((a * logprobs + b * entropy).sum(), params)
    # the straightforward computation in float64: float32 rounding alone moves its own gradients by up to
    # 2e-5 on these shapes, so two float32 orderings may differ by twice that
    exact = [p.detach().double().requires_grad_() for p in params]
    ref_logprobs, ref_entropy = _straightforward(
        exact[0], exact[1], exact[2] if with_bias else None, targets, temperature
    )
    ref_grads = torch.autograd.grad((a.double() * ref_logprobs + b.double() * ref_entropy).sum(), exact)

    torch.testing.assert_close(logprobs, ref_logprobs.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy.float(), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=3e-5)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (5,), generator=g)

    def loss(h, w, bb):
        logprobs, entropy = chunked_token_logprobs(h, w, bb, targets, 0.7, chunk_rows=2, with_entropy=True)
        return logprobs * 1.5 - entropy

    assert torch.autograd.gradcheck(loss, (hidden, weight, bias))


def test_tied_weight_gets_both_gradients():
    # the head weight is also the input embedding: its gradient is the sum of both paths
    g = torch.Generator().manual_seed(2)
    embedding = torch.randn(20, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 20, (2, 5), generator=g)
    targets = torch.randint(0, 20, (2, 5), generator=g)
    got = chunked_token_logprobs(torch.tanh(embedding[ids]), embedding, None, targets, chunk_rows=3)
    want = _straightforward(torch.tanh(embedding[ids]), embedding, None, targets, 1.0)[0]
    got, want = torch.autograd.grad(got.sum(), embedding), torch.autograd.grad(want.sum(), embedding)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_frozen_weight_and_no_grad():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 8, generator=g, requires_grad=True)
    weight = torch.randn(30, 8, generator=g)  # a frozen head: only the hidden states need a gradient
    targets = torch.randint(0, 30, (4,), generator=g)
    chunked_token_logprobs(hidden, weight, None, targets, chunk_rows=3).sum().backward()
    ref_hidden = hidden.detach().clone().requires_grad_()
    _straightforward(ref_hidden, weight, None, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        out = chunked_token_logprobs(hidden, weight, None, targets)
    assert not out.requires_grad and out.shape == (4,)


def test_half_precision_inputs_give_float32():
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(6, 16, generator=g).bfloat16()
    weight = torch.randn(40, 16, generator=g).bfloat16()
    targets = torch.randint(0, 40, (6,), generator=g)
    logprobs = chunked_token_logprobs(hidden, weight, None, targets, chunk_rows=4)
    assert logprobs.dtype == torch.float32
    want = torch.log_softmax(hidden.float() @ weight.float().t(), -1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(logprobs, want, rtol=2e-2, atol=2e-2)


def test_bad_arguments_raise_clear_errors():
    hidden, weight, targets = torch.randn(3, 4), torch.randn(10, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="weight"):
        chunked_token_logprobs(hidden, torch.randn(10, 5), None, targets)
    with pytest.raises(ValueError, match="bias"):
        chunked_token_logprobs(hidden, weight, torch.randn(9), targets)
    with pytest.raises(ValueError, match="targets"):
        chunked_token_logprobs(hidden, weight, None, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs(hidden, weight, None, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_token_logprobs(hidden, weight, None, targets, chunk_rows=0)


@pytest.mark.parametrize("which", ["logprobs", "entropy"])
def test_one_output_gradients_match_straightforward(which):
    # the backward's in-place paths: logprobs alone (no entropy block) and an entropy-only loss
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=g, requires_grad=True)
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (9,), generator=g)
    a = torch.randn(9, generator=g)
    ref_logprobs, ref_entropy = _straightforward(hidden, weight, None, targets, 0.8)
    if which == "logprobs":
        got = chunked_token_logprobs(hidden, weight, None, targets, temperature=0.8, chunk_rows=4)
        want = ref_logprobs
    else:
        got = chunked_token_logprobs(hidden, weight, None, targets, 0.8, chunk_rows=4, with_entropy=True)[1]
        want = ref_entropy
    grads = torch.autograd.grad((a * got).sum(), [hidden, weight])
    ref_grads = torch.autograd.grad((a * want).sum(), [hidden, weight])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(grads, ref_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_tiles_follow_the_row_group_and_tile_size(monkeypatch):
    from rlhfkit.core import chunked_logprobs

    # tiles of at most 400 logits: 10-row groups take 40 columns of the 100-token vocabulary, the last
    # 5-row group 80; every tile is one matmul of its rows against its slice of the weight
    monkeypatch.setattr(chunked_logprobs, "TILE_ELEMENTS", 400)
    monkeypatch.setattr(chunked_logprobs, "MIN_TILE_COLUMNS", 8)
    monkeypatch.setattr(chunked_logprobs, "ROW_GROUP", 10)
    seen = []
    real = torch.nn.functional.linear

    def linear(h, w, *args):
        seen.append((h.shape[0], w.shape[0]))
        return real(h, w, *args)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    g = torch.Generator().manual_seed(7)
    hidden, weight = torch.randn(25, 4, generator=g), torch.randn(100, 4, generator=g)
    targets = torch.randint(0, 100, (25,), generator=g)
    got = chunked_token_logprobs(hidden, weight, None, targets)
    assert seen == [(10, 40), (10, 40), (10, 20)] * 2 + [(5, 80), (5, 20)]
    torch.testing.assert_close(got, _straightforward(hidden, weight, None, targets, 1.0)[0])
    seen.clear()
    chunked_token_logprobs(hidden, weight, None, targets, chunk_rows=25)  # chunk_rows sets the row group
    assert seen == [(25, 16)] * 6 + [(25, 4)]


def test_online_log_sum_exp_across_tiles_of_rising_logits(monkeypatch):
    # logits near 1,000 whose row maximum sits in later and later tiles: every tile rescales the running sums,
    # and nothing overflows; values and gradients (float64) stay those of the straightforward computation
    from rlhfkit.core import chunked_logprobs

    monkeypatch.setattr(chunked_logprobs, "TILE_ELEMENTS", 1)
    monkeypatch.setattr(chunked_logprobs, "MIN_TILE_COLUMNS", 3)
    g = torch.Generator().manual_seed(8)
    hidden = torch.cat([torch.ones(6, 1), torch.randn(6, 2, generator=g)], 1).double().requires_grad_()
    ramp = torch.linspace(990.0, 1000.0, 20, dtype=torch.float64)[:, None]
    weight = torch.cat([ramp, torch.randn(20, 2, generator=g, dtype=torch.float64)], 1).requires_grad_()
    targets = torch.tensor([0, 19, 3, 10, 17, 5])
    got = chunked_token_logprobs(hidden, weight, None, targets, 1.3, chunk_rows=4, with_entropy=True)
    log_p = torch.log_softmax(hidden @ weight.t() / 1.3, -1)  # float64 all the way
    want = log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)
    for mine, theirs in zip(got, want):
        assert torch.isfinite(mine).all()
        torch.testing.assert_close(mine, theirs)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_token_logprobs(h, w, None, targets, 1.3, chunk_rows=4, with_entropy=True),
        (hidden, weight),
    )


class _LiveBlocks(TorchDispatchMode):
    """Counts how many distinct logits-shaped storages of at least `numel` elements are alive at once (weak
    references), and the largest such tensor made; tensors whose last dim is the hidden size (gradients of
    the hidden states and the weight) are not logits."""

    def __init__(self, numel: int, hidden_size: int):
        super().__init__()
        self.numel, self.hidden_size, self.alive, self.most, self.largest = numel, hidden_size, [], 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.numel and out.shape[-1] != self.hidden_size:
            self.largest = max(self.largest, out.numel())
            self.alive = [ref for ref in self.alive if ref() is not None] + [weakref.ref(out)]
            storages = {ref().untyped_storage().data_ptr() for ref in self.alive if ref() is not None}
            self.most = max(self.most, len(storages))
        return out


@pytest.mark.parametrize("use_entropy", [True, False])
def test_no_logits_beyond_one_tile_and_its_exponentials(monkeypatch, use_entropy):
    # forward and backward build no logits-shaped block larger than one tile (40 rows x 100 tokens here, of a
    # 1,000-token vocabulary), and hold at most two at once: a tile and, for the entropy, its exponentials
    from rlhfkit.core import chunked_logprobs

    monkeypatch.setattr(chunked_logprobs, "TILE_ELEMENTS", 40 * 100)
    monkeypatch.setattr(chunked_logprobs, "MIN_TILE_COLUMNS", 8)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(120, 8, generator=g, requires_grad=True)
    weight = torch.randn(1000, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 1000, (120,), generator=g)
    forward, backward = _LiveBlocks(40 * 100, hidden_size=8), _LiveBlocks(40 * 100, hidden_size=8)
    with forward:
        logprobs, entropy = chunked_token_logprobs(
            hidden, weight, None, targets, chunk_rows=40, with_entropy=True
        )
    loss = logprobs.sum() + (entropy.sum() if use_entropy else 0)  # unused: a logged statistic
    with backward:
        loss.backward()
    assert forward.largest == backward.largest == 40 * 100
    assert forward.most == 2 and backward.most == (2 if use_entropy else 1)
    # and the gradients are the straightforward ones
    exact = [hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()]
    ref_logprobs, ref_entropy = _straightforward(exact[0], exact[1], None, targets, 1.0)
    (ref_logprobs.sum() + (ref_entropy.sum() if use_entropy else 0)).backward()
    torch.testing.assert_close(hidden.grad, exact[0].grad.float(), rtol=1e-4, atol=3e-5)
    torch.testing.assert_close(weight.grad, exact[1].grad.float(), rtol=1e-4, atol=3e-5)


@pytest.mark.parametrize("row_group", [4, 64])
def test_tiles_cover_rows_and_vocabulary(monkeypatch, row_group):
    # tiles of 4 rows x 8 tokens (and of all 21 rows x 8 tokens): every target column, bias entry and weight
    # row is reached from exactly one tile per row group, with both outputs differentiated
    from rlhfkit.core import chunked_logprobs

    monkeypatch.setattr(chunked_logprobs, "TILE_ELEMENTS", 1)
    monkeypatch.setattr(chunked_logprobs, "MIN_TILE_COLUMNS", 8)
    tiles = list(chunked_logprobs._tiles(21, 50, row_group))
    assert len(tiles) == (6 if row_group == 4 else 1) * 7  # 7 column tiles, the last of 2 tokens
    assert tiles[-1][1] == slice(48, 50)
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(21, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (21,), generator=g)
    a, b = torch.randn(21, generator=g), torch.randn(21, generator=g)
    logprobs, entropy = chunked_token_logprobs(
        hidden, weight, bias, targets, 0.7, row_group, with_entropy=True
    )
    grads = torch.autograd.grad((a * logprobs + b * entropy).sum(), [hidden, weight, bias])
    exact = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    ref_logprobs, ref_entropy = _straightforward(*exact, targets, 0.7)
    ref_grads = torch.autograd.grad((a.double() * ref_logprobs + b.double() * ref_entropy).sum(), exact)
    torch.testing.assert_close(logprobs, ref_logprobs.float())
    torch.testing.assert_close(entropy, ref_entropy.float())
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=3e-5)
