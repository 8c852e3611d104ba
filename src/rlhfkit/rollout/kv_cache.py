"""The decode loop's KV cache: transformers' `DynamicCache` with each attention layer's keys and values in one
buffer sized for the whole rollout.

`DynamicLayer` appends every token with `torch.cat`, which allocates and copies the layer's whole cache once
per token: on CPU that copy and its fresh memory cost about as much as the step's matmuls at small widths.
Writing into a buffer allocated once (prompt width + max_new_tokens) keeps the step's cost to the new token.
Unlike transformers' `StaticLayer`, the layer still drops batch rows (`batch_select_indices`), so the loop
can keep cutting ended rows out of the batch, and attention reads only the filled prefix.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of the filled prefix of a preallocated buffer."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_buffer = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
        self.value_buffer = value_states.new_empty(
            (*value_states.shape[:2], self.capacity, value_states.shape[-1])
        )
        self.length = 0
        self._expose()
        self.is_initialized = True

    def _expose(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded: {end} positions")
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self._expose()

    def reset(self) -> None:
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer is the decode loop's cache; it never crops")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer is the decode loop's cache; it never repeats rows")


def decode_cache(config, capacity: int) -> DynamicCache:
    """`DynamicCache(config=config)` with every plain attention layer preallocated for `capacity` positions.

    Layers of other kinds (sliding windows, linear attention, ...) and caches whose layers are created lazily
    stay as transformers builds them.
    """
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None) or []
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[index] = PreallocatedLayer(capacity)
    return cache
