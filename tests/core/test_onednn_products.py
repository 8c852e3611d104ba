"""The three products of a linear map: oneDNN's equal torch's to float rounding, and each takes oneDNN only
from its crossover in rows up and for plain float32 CPU tensors."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.core import onednn_products
from rlhfkit.core.onednn_products import linear_forward, linear_input_grad, linear_weight_grad, onednn_usable

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def conversions(monkeypatch):
    """How many tensors were converted to oneDNN's layout (0: torch's product ran)."""
    count = []
    to_mkldnn = torch.Tensor.to_mkldnn
    monkeypatch.setattr(torch.Tensor, "to_mkldnn", lambda self, *a: count.append(1) or to_mkldnn(self, *a))
    return count


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("rows", [8, 300, 1100])  # below both crossovers, between them, above both
def test_each_product_equals_torchs_and_takes_onednn_from_its_crossover(rows, conversions):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(rows, 300), torch.randn(500, 300), torch.randn(500)
    grad = torch.randn(rows, 500)
    expected = {"forward": x @ weight.T + bias, "input": grad @ weight, "weight": grad.T @ x}
    products = {
        "forward": lambda: linear_forward(x, weight, bias),
        "input": lambda: linear_input_grad(grad, weight),
        "weight": lambda: linear_weight_grad(grad, x),
    }
    crossover = {"forward": onednn_products.ONEDNN_MIN_ROWS, "input": onednn_products.ONEDNN_MIN_ROWS,
                 "weight": onednn_products.WEIGHT_GRAD_MIN_ROWS}  # fmt: skip
    for name, product in products.items():
        conversions.clear()
        got = product()
        assert got.layout == torch.strided and got.shape == expected[name].shape, name
        assert _relative_error(got, expected[name]) < 1e-5, name
        assert bool(conversions) == (rows >= crossover[name]), name


def test_only_plain_float32_cpu_tensors_without_autocast_are_usable(conversions):
    x, weight = torch.randn(200, 64), torch.randn(32, 64)
    assert onednn_usable(x, weight, None)
    assert not onednn_usable(x.double(), weight)
    assert not onednn_usable(x, weight.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_usable(x, weight)
    conversions.clear()
    torch.testing.assert_close(linear_forward(x.double(), weight.double()), x.double() @ weight.double().T)
    assert not conversions  # torch's product


def test_narrow_maps_keep_torchs_product(conversions):
    x, weight = torch.randn(2000, 64), torch.randn(128, 64)  # 64 inputs: below ONEDNN_MIN_INPUTS
    linear_forward(x, weight), linear_input_grad(torch.randn(2000, 128), weight)
    linear_weight_grad(torch.randn(2000, 128), x)
    assert not conversions


def test_the_chunked_head_on_onednn_matches_full_logits(conversions):
    from rlhfkit.core.chunked_logprobs import chunked_token_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(1100, 320, requires_grad=True)  # rows above both crossovers
    weight = (torch.randn(3000, 320) / 8).requires_grad_()
    targets = torch.randint(0, 3000, (1100,))
    got = chunked_token_logprobs(hidden, weight, None, targets, temperature=0.7)
    assert conversions  # the tiles' forward products ran on oneDNN
    expected = (hidden @ weight.T / 0.7).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    weights_of_rows = torch.randn(1100)
    got_grads = torch.autograd.grad((got * weights_of_rows).sum(), [hidden, weight])
    expected_grads = torch.autograd.grad((expected * weights_of_rows).sum(), [hidden, weight])
    for g, e in zip(got_grads, expected_grads):
        assert _relative_error(g, e) < 1e-5
