"""The name a transformers forward takes and returns its KV cache under.

transformers 5.23 renamed `past_key_values` to `cache`, in arguments and in outputs; the old name still works
but warns on every call. Asking the model which one it takes keeps rlhfkit quiet on both sides of the rename.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn


def cache_keyword(model: nn.Module) -> str:
    """`"cache"` if `model.forward` names that argument, else `"past_key_values"` (transformers < 5.23)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(outputs: Any) -> Any:
    """The KV cache in a model output under either name (None when the forward kept none), without the
    deprecated `outputs.past_key_values` property that warns."""
    return outputs.get("cache", outputs.get("past_key_values"))
