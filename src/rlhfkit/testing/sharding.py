"""A stand-in for DeepSpeed ZeRO-3's sharding, for tests on CPU (DeepSpeed needs GPUs).

`StandInZero3(model)` empties every weight of `model` in place, as a ZeRO-3 process holds only its shard
(`ds_numel` keeps the whole size), and `gather(params)` plays `deepspeed.zero.GatheredParameters`: the
weights are whole inside its block. It records the bytes whole at once, so a test can bound a sync's peak.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class StandInZero3:
    """See the module docstring: `peak` is the most bytes ever gathered at once, `calls` the gathers."""

    def __init__(self, model: torch.nn.Module):
        self.data: dict[int, torch.Tensor] = {}
        self.live = self.peak = self.calls = 0
        for param in model.parameters():
            self.data[id(param)], param.ds_numel = param.data, param.numel()
            param.data = torch.empty(0, dtype=param.dtype)

    @contextlib.contextmanager
    def gather(self, params: list[torch.nn.Parameter]) -> Iterator[None]:
        self.calls += 1
        size = sum(self.data[id(p)].numel() * p.element_size() for p in params)
        for param in params:
            param.data = self.data[id(param)]
        self.live += size
        self.peak = max(self.peak, self.live)
        try:
            yield
        finally:
            self.live -= size
            for param in params:
                param.data = torch.empty(0, dtype=param.dtype)
