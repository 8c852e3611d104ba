"""Frozen reference models for the KL penalty.

`create_reference_model` returns a frozen deep copy of the policy. With `num_shared_layers=N` the
embeddings and the first N transformer layers are *not* copied: the reference holds the very same
parameter tensors as the policy, and they are frozen in both, so only the remaining layers cost memory.
For a PEFT policy no copy is made at all: the reference is the policy run under `reference_context`
(adapters disabled, or the frozen `reference` adapter active).
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

from torch import nn

from rlhfkit.models.adapters import peft_model_of, reference_context

# `{layer}` marks the layer index; matched anywhere in a parameter name after a dot or at its start.
LAYER_PATTERNS: tuple[str, ...] = (
    "transformer.h.{layer}",  # GPT-2, GPT-J, BLOOM
    "model.layers.{layer}",  # Llama, Qwen2, Mistral, Gemma
    "model.language_model.layers.{layer}",  # multimodal wrappers of the above
    "gpt_neox.layers.{layer}",  # Pythia / GPT-NeoX
    "model.decoder.layers.{layer}",  # OPT
    "encoder.block.{layer}",  # T5 (the encoder's first N blocks)
    "transformer.layers.{layer}",
)


class AdapterReference(nn.Module):
    """A PEFT policy seen as its reference: calls run under `reference_context`. Holds no weights."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        object.__setattr__(self, "_policy", policy)  # not a submodule: parameters() stays empty

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with reference_context(self._policy) as model:
            return model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with reference_context(self._policy) as model:
            return model.generate(*args, **kwargs)

    @property
    def config(self) -> Any:
        return self._policy.config


def _layer_regex(pattern: str) -> re.Pattern[str]:
    if pattern.count("{layer}") != 1:
        raise ValueError(f"pattern must contain '{{layer}}' exactly once, e.g. 'model.layers.{{layer}}'; got {pattern!r}")
    head, tail = pattern.split("{layer}")
    return re.compile(r"(?:^|\.)" + re.escape(head) + r"(\d+)" + re.escape(tail) + r"\.")


def shared_parameter_names(model: nn.Module, num_shared_layers: int, pattern: str | None = None) -> list[str]:
    """Names of the parameters shared with the reference: everything before the first transformer layer
    (the embeddings) and layers 0 .. num_shared_layers-1."""
    names = [n for n, _ in model.named_parameters()]
    candidates = [pattern] if pattern is not None else list(LAYER_PATTERNS)
    for candidate in candidates:
        regex = _layer_regex(candidate)
        indices = [int(m.group(1)) if (m := regex.search(n)) else None for n in names]
        if any(i is not None for i in indices):
            break
    else:
        raise ValueError(
            f"no transformer layers found in {type(model).__name__} (tried {candidates}); pass "
            "pattern='<layer prefix>.{layer}' naming your layers, e.g. pattern='model.layers.{layer}'"
        )
    num_layers = max(i for i in indices if i is not None) + 1
    if num_shared_layers > num_layers:
        raise ValueError(f"num_shared_layers={num_shared_layers} but the model has only {num_layers} layers")
    shared, seen_layer = [], False
    for name, index in zip(names, indices):
        seen_layer = seen_layer or index is not None
        if (not seen_layer) or (index is not None and index < num_shared_layers):
            shared.append(name)
    return shared


def create_reference_model(
    model: nn.Module, num_shared_layers: int | None = None, pattern: str | None = None
) -> nn.Module:
    """A frozen (eval-mode, no-grad) reference for `model`.

    `num_shared_layers=None`: a full independent copy. `num_shared_layers=N`: the embeddings and first N
    layers are the same tensors in both models and are frozen in the policy too. `pattern` names the
    layer prefix with `{layer}` for architectures not in `LAYER_PATTERNS`. A PEFT policy gets an
    `AdapterReference` (no copy).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if peft_model_of(model) is not None:
        if num_shared_layers is not None:
            warnings.warn(
                "num_shared_layers is ignored for a PEFT model: its reference already shares all base weights",
                stacklevel=2,
            )
        return AdapterReference(model)
    if num_shared_layers is None:
        ref = copy.deepcopy(model)
    else:
        if isinstance(num_shared_layers, bool) or not isinstance(num_shared_layers, int) or num_shared_layers < 1:
            raise ValueError(
                f"num_shared_layers must be a positive integer (or None for a full copy), got {num_shared_layers!r}"
            )
        params = dict(model.named_parameters())
        shared = [params[n] for n in shared_parameter_names(model, num_shared_layers, pattern)]
        for param in shared:
            param.requires_grad_(False)
        # deepcopy returns memo entries as they are: the shared tensors are reused, not copied
        ref = copy.deepcopy(model, memo={id(p): p for p in shared})
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref.eval()


def count_shared_parameters(model_a: nn.Module, model_b: nn.Module) -> int:
    """Number of parameter elements whose storage both models use (memory the reference does not add)."""
    storages_b = {p.untyped_storage().data_ptr() for p in model_b.parameters()}
    seen: set[int] = set()
    total = 0
    for param in model_a.parameters():
        ptr = param.untyped_storage().data_ptr()
        if ptr in storages_b and ptr not in seen:
            seen.add(ptr)
            total += param.numel()
    return total


def unique_parameter_bytes(*models: nn.Module) -> int:
    """Bytes of parameter storage used by `models` together, counting shared storage once."""
    storages: dict[int, int] = {}
    for model in models:
        for param in model.parameters():
            storage = param.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


__all__ = [
    "LAYER_PATTERNS",
    "AdapterReference",
    "count_shared_parameters",
    "create_reference_model",
    "reference_context",
    "shared_parameter_names",
    "unique_parameter_bytes",
]
