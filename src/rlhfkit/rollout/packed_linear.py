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

A PEFT LoRA layer over a large linear layer runs as one product too, on a oneDNN copy of its merged weight
W + sum of scaling * B A over the active adapters: its own forward adds two small products per adapter and
per layer, slow in Python at 16 rows. The model's weights are never changed. Layers the merge cannot stand
for (DoRA and other variants, adapters disabled or already merged, a bias on B, dropout that is active) keep
their forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PACK_MIN_ELEMENTS = 2**19  # at 16 rows: 896 x 896 gains 1.6x, 128 x 896 loses (0.74x)
PACK_MIN_INPUTS = 256  # 2,048 x 256 gains 1.4x at 16 rows


def packable(module: torch.nn.Module) -> bool:
    """Whether `module` is a large CPU `nn.Linear` that oneDNN multiplies faster (and may run it)."""
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


def _lora_factors(module: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, float]] | None:
    """[(A, B, scaling)] of each active adapter of a PEFT LoRA layer whose forward is base(x) + sum of
    scaling * B A x, so that one merged weight can stand for it; None for anything else."""
    if not (hasattr(module, "lora_A") and hasattr(module, "scaling") and packable(module.base_layer)):
        return None
    if module.disable_adapters or module.merged:
        return None  # the base alone (its own weight already holds a merged adapter)
    factors = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        a, b, dropout = module.lora_A[name], module.lora_B[name], module.lora_dropout[name]
        vanilla = name not in getattr(module, "lora_variant", {}) and type(a) is type(b) is torch.nn.Linear
        inactive_dropout = not dropout.training or getattr(dropout, "p", 0.0) == 0.0
        if not (vanilla and b.bias is None and inactive_dropout):
            return None
        factors.append((a.weight.detach(), b.weight.detach(), module.scaling[name]))
    return factors


def _merged_weight(base: torch.nn.Linear, factors: list[tuple[torch.Tensor, torch.Tensor, float]]):
    """W + sum of scaling * B A, computed in float32, in W's dtype."""
    merged = base.weight.detach().float()
    for a, b, scaling in factors:
        merged = merged.addmm(b.float(), a.float(), alpha=scaling)
    return merged.to(base.weight.dtype)


def _packed_forward(weight: torch.Tensor, bias: torch.Tensor | None, layer: torch.nn.Module):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs:  # PEFT's per-row adapter choice and the like: the layer's own forward
            return type(layer).forward(layer, x, *args, **kwargs)
        flat = x.reshape(-1, x.shape[-1]).contiguous().to(weight.dtype).to_mkldnn()
        out = torch._C._nn.mkldnn_linear(flat, weight, bias).to_dense()
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return forward


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, every large CPU `nn.Linear` of `model`, and every LoRA layer over one, runs on a
    oneDNN copy of its (merged) weights (no gradient: for sampling only); yields how many. Off a CPU,
    without oneDNN, or with gradients on: none."""
    usable = torch.backends.mkldnn.is_available() and not torch.is_grad_enabled()
    modules = list(model.modules()) if usable else []
    lora = {id(m): (m, f) for m in modules if (f := _lora_factors(m)) is not None}
    merged_bases = {id(m.base_layer) for m, _ in lora.values()}  # run inside the merged product
    plain = [m for m in modules if packable(m) and id(m) not in merged_bases]
    layers = plain + [m for m, _ in lora.values()]
    own = {id(layer): layer.__dict__.get("forward") for layer in layers}  # a forward set on the instance
    for layer in layers:
        linear = layer.base_layer if id(layer) in lora else layer
        weight = _merged_weight(linear, lora[id(layer)][1]) if id(layer) in lora else linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach().float().to_mkldnn()
        layer.forward = _packed_forward(weight.to_mkldnn(), bias, layer)
        del weight  # a merged weight lives on only as its oneDNN copy
    try:
        yield len(layers)
    finally:
        for layer in layers:
            if own[id(layer)] is None:
                del layer.forward  # the class's own forward again
            else:
                layer.forward = own[id(layer)]
