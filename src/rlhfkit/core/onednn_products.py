"""The three matrix products of a linear map, on oneDNN where it beats torch's float32 CPU product.

For y = x W^T (x: (N, in), W: (out, in)) training needs the forward y, the input gradient g W and the
weight gradient g^T x (g = dL/dy). On a CPU torch runs float32 products on its BLAS (MKL); oneDNN's inner
product does the same ones faster at a transformer's sizes from a few hundred rows up, and the weight
gradient from about a thousand rows (benchmarks/onednn_training.json, conversions of the rows included; the
weight is read in place). Each function here takes oneDNN when `onednn_usable`, its rows reach the crossover
and the map has `ONEDNN_MIN_INPUTS` inputs, else torch's product: the results are the same up to float
rounding either way.
"""

from __future__ import annotations

import torch

ONEDNN_MIN_ROWS = 256  # forward and input gradient: 1.4-4x at 256 rows; at 64, 0.5x to 8x from run to run
WEIGHT_GRAD_MIN_ROWS = 1024  # the weight gradient: 0.6-0.8x at 256 rows for the 4,864 x 896 matrices
ONEDNN_MIN_INPUTS = 256  # narrower maps (the 64-wide benchmark models) keep torch's: `rollout.packed_linear`


def onednn_usable(*tensors: torch.Tensor | None) -> bool:
    """Whether oneDNN may run products of these tensors: plain float32 CPU tensors (no subclass such as a
    DTensor shard), torch built with oneDNN, no CPU autocast (which would pick another dtype) and no
    torch.compile tracing."""
    return (
        torch.backends.mkldnn.is_available()
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()  # a traced graph keeps torch's ops
        and all(
            t is None
            or (type(t.data) is torch.Tensor and t.dtype == torch.float32 and t.device.type == "cpu")
            for t in tensors
        )
    )


def linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b for x (N, in), weight (out, in), bias (out,) or None -> (N, out); no autograd graph."""
    x, weight = x.detach(), weight.detach()
    if x.shape[0] < ONEDNN_MIN_ROWS or x.shape[1] < ONEDNN_MIN_INPUTS or not onednn_usable(x, weight, bias):
        return torch.nn.functional.linear(x, weight, None if bias is None else bias.detach())
    dnn_bias = None if bias is None else bias.detach().to_mkldnn()
    return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), weight.contiguous(), dnn_bias).to_dense()


def linear_input_grad(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """g W for g (N, out), weight (out, in) -> (N, in)."""
    grad, weight = grad.detach(), weight.detach()
    if (
        grad.shape[0] < ONEDNN_MIN_ROWS
        or weight.shape[1] < ONEDNN_MIN_INPUTS
        or not onednn_usable(grad, weight)
    ):
        return grad.mm(weight)
    rows_by_inputs = [grad.shape[0], weight.shape[1]]
    dnn_grad = grad.contiguous().to_mkldnn()
    return torch.ops.aten.mkldnn_linear_backward_input(
        rows_by_inputs, dnn_grad, weight.contiguous()
    ).to_dense()


def linear_weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g^T x for g (N, out), x (N, in) -> (out, in): the weight's gradient, summed over the N rows."""
    grad, x = grad.detach(), x.detach()
    if grad.shape[0] < WEIGHT_GRAD_MIN_ROWS or x.shape[1] < ONEDNN_MIN_INPUTS or not onednn_usable(grad, x):
        return grad.t().mm(x)
    # the weight argument only gives the result's dtype and device
    dnn_grad, dnn_x = grad.contiguous().to_mkldnn(), x.contiguous().to_mkldnn()
    return torch.ops.aten.mkldnn_linear_backward_weights(dnn_grad, dnn_x, x, False)[0]
