"""Optimizer construction options shared by the trainers that build their own optimizer (PPO, DDPO)."""

from __future__ import annotations

from typing import Any

import torch


def fused_optimizer_kwargs(params: list[torch.Tensor]) -> dict[str, Any]:
    """`{"fused": True}` when torch has a fused Adam/AdamW kernel for every parameter, else `{}`.

    The default per-tensor loop launches a dozen small kernels per parameter; the fused kernel does one
    pass. Measured on 2 CPU threads, per optimizer step: 2.5 -> 0.65 ms for the 0.5M-parameter benchmark
    model, 36 -> 7.8 ms for the 10M one. Results agree to float rounding.
    """
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    supported = set(_get_fused_kernels_supported_devices())
    ok = bool(params) and all(p.device.type in supported and torch.is_floating_point(p) for p in params)
    return {"fused": True} if ok else {}
