"""8-bit / 4-bit base-model loading through bitsandbytes (the `quant` extra).

Only the frozen base is quantised; LoRA adapters and the value head stay in float32.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

QUANT_EXTRA_HINT = "pip install 'rlhfkit[quant]'"


def require_bitsandbytes(argument: str) -> None:
    """Raise a clear ImportError naming the extra to install when bitsandbytes is missing."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(f"{argument}=True needs the bitsandbytes package: {QUANT_EXTRA_HINT}")


def bnb_quantization_config(
    load_in_8bit: bool = False, load_in_4bit: bool = False, compute_dtype: torch.dtype = torch.float32
) -> Any | None:
    """A `BitsAndBytesConfig` for the requested precision, or None when neither flag is set."""
    if load_in_8bit and load_in_4bit:
        raise ValueError("load_in_8bit and load_in_4bit are exclusive; set at most one")
    if not (load_in_8bit or load_in_4bit):
        return None
    require_bitsandbytes("load_in_8bit" if load_in_8bit else "load_in_4bit")
    from transformers import BitsAndBytesConfig

    if load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=compute_dtype, bnb_4bit_quant_type="nf4"
    )


def is_quantized(model: Any) -> bool:
    return bool(getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)) or (
        getattr(model, "quantization_method", None) is not None
    )
