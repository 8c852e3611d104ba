"""Training passes on a CPU with the model's large float32 linear layers on oneDNN, forward and backward.

A scoring or training pass multiplies a thousand rows or so (16 completions of ~70 tokens) by each weight
matrix. At Qwen2.5-0.5B's shape oneDNN does those products faster than the BLAS torch uses for float32 on a
CPU (benchmarks/onednn_training.json, conversions included): the forward X W^T, the input gradient dY W and
the weight gradient dY^T X. `onednn_linears` runs each large `nn.Linear` of a model through `OneDNNLinear`
within its block: the same function as `F.linear` (values and gradients equal up to float rounding), on
oneDNN's inner-product kernels. Weights are read at each call, never copied beyond the call: a step of the
optimizer, a sharded or PEFT-wrapped weight and a frozen reference all work unchanged, and nothing stays
resident (a reference converted once would hold another 1.4 GiB at that shape).

The layers are those `packed_linear` converts for sampling (`packable`); each product takes oneDNN from
its measured crossover in rows up (`core.onednn_products`), and bfloat16 layers, autocast and fewer rows
keep torch's linear (bfloat16 products on a CPU are oneDNN's already). Where
the result's graph would be replayed, the block changes nothing: a model with activation checkpointing
recomputes its layers in backward, outside the block, and must see the same operations both times.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

from rlhfkit.core import onednn_products
from rlhfkit.core.onednn_products import linear_forward, linear_input_grad, linear_weight_grad, onednn_usable
from rlhfkit.rollout.packed_linear import packable


class OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b, forward and both gradients through `core.onednn_products` (oneDNN where it pays)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = linear_forward(flat, weight, bias)
        ctx.save_for_backward(flat if ctx.needs_input_grad[1] else None, weight)  # no copies: held anyway
        ctx.x_shape = x.shape
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        flat, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = linear_input_grad(grad, weight).reshape(ctx.x_shape) if need_x else None
        grad_w = linear_weight_grad(grad, flat) if need_w else None
        return grad_x, grad_w, grad.sum(0) if need_b else None


def _onednn_forward(layer: torch.nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias = layer.weight, layer.bias
        if x.shape[:-1].numel() < onednn_products.ONEDNN_MIN_ROWS or not onednn_usable(x, weight, bias):
            return torch.nn.functional.linear(x, weight, bias)
        return OneDNNLinear.apply(x, weight, bias)

    return forward


@contextlib.contextmanager
def onednn_linears(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, every large float32 CPU `nn.Linear` of `model` (PEFT's base layers included) runs
    through `OneDNNLinear`, with or without gradients; yields how many. Without oneDNN, in a model with
    activation checkpointing on, or a torch.compile'd one: none."""
    modules = list(model.modules()) if torch.backends.mkldnn.is_available() else []
    if any(getattr(m, "gradient_checkpointing", False) is True for m in modules):
        modules = []  # backward replays the layers' forwards, outside this block
    if any(hasattr(m, "_orig_mod") for m in modules):
        modules = []  # torch.compile'd: patched forwards would be traced or recompiled
    layers = [
        m
        for m in modules
        if packable(m) and m.weight.dtype == torch.float32 and "forward" not in m.__dict__  # not patched
    ]
    for layer in layers:
        layer.forward = _onednn_forward(layer)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward  # the class's own forward again


def with_onednn_linears(fn):
    """Decorator: `fn(model, ...)` runs within `onednn_linears(model)`."""

    @functools.wraps(fn)
    def wrapped(model: torch.nn.Module, *args, **kwargs):
        with onednn_linears(model):
            return fn(model, *args, **kwargs)

    return wrapped
