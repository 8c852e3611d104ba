"""Sampling on a CPU with the model's large linear layers in oneDNN's weight format.

A decode step multiplies 16 or so rows by every weight matrix: far too few rows for the BLAS that torch uses
for float32 matrix products on a CPU. oneDNN does the same products faster at Qwen2.5-0.5B's shape (16 rows:
2.5x for the MLP matrices, 2.9x for the 151,936-token head; benchmarks/packed_linear.json).
`packed_linears` converts each large `nn.Linear` weight to a oneDNN tensor on entry and runs the layer
through oneDNN until exit; the copies (as large as those weights) live only that long. Results differ from
torch's by float rounding, as any two matrix-product kernels do. Layers with fewer than `PACK_MIN_ELEMENTS`
weights or `PACK_MIN_INPUTS` inputs are left alone: small products gain little or lose to the conversions
(256 x 64 at 16 rows: 0.2x), and 64-input layers (the large-vocabulary benchmark models' head) measured both
above and below 1x.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PACK_MIN_ELEMENTS = 2**19  # at 16 rows: 896 x 896 gains 1.6x, 128 x 896 loses (0.74x)
PACK_MIN_INPUTS = 256  # 2,048 x 256 gains 1.4x at 16 rows


def _packable(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear
        and isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.numel() >= PACK_MIN_ELEMENTS
        and weight.shape[1] >= PACK_MIN_INPUTS
        and not hasattr(weight, "ds_id")  # a ZeRO-3 shard
        and not hasattr(module, "_hf_hook")  # accelerate moves its weight (offloading) in its own forward
    )


def _packed_forward(weight: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous().to(weight.dtype).to_mkldnn()
        out = torch._C._nn.mkldnn_linear(flat, weight, bias).to_dense()
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return forward


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, every large CPU `nn.Linear` of `model` runs on a oneDNN copy of its weights (no
    gradient: for sampling only); yields how many. Off a CPU, without oneDNN, or with gradients on: none."""
    usable = torch.backends.mkldnn.is_available() and not torch.is_grad_enabled()
    layers = [m for m in model.modules() if _packable(m)] if usable else []
    own = {id(layer): layer.__dict__.get("forward") for layer in layers}  # a forward set on the instance
    for layer in layers:
        bias = None if layer.bias is None else layer.bias.detach().float().to_mkldnn()
        layer.forward = _packed_forward(layer.weight.detach().to_mkldnn(), bias)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            if own[id(layer)] is None:
                del layer.forward  # the class's own forward again
            else:
                layer.forward = own[id(layer)]
