"""The one test for "is this a PEFT model": every trainer, wrapper and scorer asks here.

Imports nothing from rlhfkit, so `rollout` and `trainers` can use it without pulling in the adapter
machinery of `models.adapters`.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def peft_model_of(model: Any) -> Any | None:
    """The `PeftModel` inside `model` (a PeftModel itself or a value-head wrapper around one), else None."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return None
    inner = getattr(model, "pretrained_model", model) if isinstance(model, nn.Module) else model
    return inner if isinstance(inner, PeftModel) else None


def is_peft_model(model: Any) -> bool:
    """True for a PeftModel or a value-head wrapper around one."""
    return peft_model_of(model) is not None


def without_peft(model: nn.Module) -> nn.Module:
    """The transformers model under the PEFT layers of a PeftModel, else `model` itself.

    The adapters stay injected in the returned model: only the PeftModel wrapper is taken off.
    """
    peft_model = peft_model_of(model)
    return peft_model.get_base_model() if peft_model is not None and peft_model is model else model
