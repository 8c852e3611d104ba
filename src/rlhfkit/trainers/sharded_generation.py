"""Generation from a model whose weights are sharded across processes (DeepSpeed ZeRO-3, FSDP2).

`generate` runs a forward per new token; gathering the shards once around the whole call, not per
token, is what makes sampling from a sharded policy affordable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def zero3_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True):
    """Under DeepSpeed ZeRO-3 with `gather`, a context that gathers `model`'s sharded weights once for a
    whole generation (fast; needs room for one full copy). Otherwise, and when `gather` is False (each
    layer is then gathered on use: slow, but any size fits), a no-op context. Under FSDP, see
    `fsdp_generation_context`.
    """
    if getattr(getattr(accelerator, "state", None), "fsdp_plugin", None) is not None:
        return fsdp_generation_context(accelerator, model, gather)  # FSDP's counterpart
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None or getattr(plugin, "zero_stage", None) != 3 or not gather:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


@contextlib.contextmanager
def fsdp_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True) -> Iterator[None]:
    """Under FSDP2, the weights of `model` that `generate` needs, all-gathered before it and re-sharded after.

    A value-head model generates through its inner model, past the root's forward hooks that would gather
    the root's own weights (embeddings, head): those are always gathered here. With `gather` every layer is
    gathered once for the whole generation (fast; room for one full copy); without it each layer is
    gathered on use, once per token (slow; any size fits). A no-op unless `model` is an FSDP2 module.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model._get_fsdp_state()._lazy_init()  # as the root's first forward would: the layers must not claim root
    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if gather else [model]
    if gather:
        model.set_reshard_after_forward(False)  # the layers' forward hooks keep what was gathered
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        if gather:
            model.set_reshard_after_forward(bool(accelerator.state.fsdp_plugin.reshard_after_forward))
