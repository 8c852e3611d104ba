"""The reference policy of the KL penalty, one story for every trainer.

`choose_reference(policy, ref_model)` decides where reference log-probabilities come from, in this order:
1. an explicit `ref_model`: used as it is, frozen (eval mode, no gradients);
2. a PEFT policy with a frozen adapter named `reference` (it started from a trained SFT LoRA, see
   `adapters.add_reference_adapter`): the policy with that adapter active, so the KL is measured
   against the SFT model and not the bare base;
3. any other PEFT policy: the policy with its adapters disabled (the base model);
4. otherwise: a frozen copy of the policy (`create_reference_model`).
The returned `Reference` is called on the policy as a context manager and yields the module to run.
Only cases 1 and 4 hold weights; with `num_shared_layers=N` a copy shares its embeddings and first N
layers with the policy (frozen in both), so only the remaining layers cost memory.
"""

from __future__ import annotations

import contextlib
import copy
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from rlhfkit.models.adapters import REFERENCE_ADAPTER_NAME, use_adapter
from rlhfkit.models.peft_detection import peft_model_of

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


class Reference:
    """Where reference log-probabilities come from; `with reference(policy) as module:` runs them.

    `kind` is "model" (a separate frozen network, `self.model`), "adapter" (the PEFT policy with its
    frozen reference adapter active) or "base" (the PEFT policy with adapters disabled). The body runs
    without gradients; the policy's active adapter and `requires_grad` flags are restored afterwards.
    """

    KINDS = ("model", "adapter", "base")

    def __init__(self, kind: str, model: nn.Module | None = None, adapter_name: str | None = None):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        if (kind == "model") != (model is not None):
            raise ValueError("a 'model' reference needs `model`; the adapter kinds hold none")
        if (kind == "adapter") != (adapter_name is not None):
            raise ValueError("an 'adapter' reference needs `adapter_name`; the other kinds take none")
        self.kind, self.model, self.adapter_name = kind, model, adapter_name

    def __repr__(self) -> str:
        detail = type(self.model).__name__ if self.model is not None else self.adapter_name
        return f"Reference({self.kind!r}{', ' + repr(detail) if detail else ''})"

    @contextlib.contextmanager
    def __call__(self, policy: nn.Module | None) -> Iterator[nn.Module]:
        with torch.no_grad():
            if self.model is not None:
                yield self.model
                return
            peft_model = peft_model_of(policy)
            if peft_model is None:
                raise ValueError(
                    f"a {self.kind!r} reference lives inside a PEFT policy, got {type(policy).__name__}"
                )
            if self.kind == "adapter":
                with use_adapter(peft_model, self.adapter_name):
                    yield policy
            else:
                with peft_model.disable_adapter():
                    yield policy


def choose_reference(
    policy: nn.Module | None,
    ref_model: nn.Module | None = None,
    *,
    num_shared_layers: int | None = None,
    pattern: str | None = None,
    adapter_name: str = REFERENCE_ADAPTER_NAME,
    argument: str = "ref_model",
) -> Reference:
    """The reference for `policy`.

    In order of preference: the explicit `ref_model`, the frozen reference adapter, the base with its
    adapters disabled, a copy of the policy.

    `num_shared_layers` and `pattern` shape the copy (see `create_reference_model`); a given `ref_model`
    or a PEFT policy ignores them with a warning (the given model is used as it is; a PEFT reference
    already shares every base weight). `argument` is the caller's name for `ref_model` in messages.
    """
    if ref_model is not None:
        if num_shared_layers is not None:
            warnings.warn(
                f"num_shared_layers={num_shared_layers} is ignored because {argument} is given: it is used "
                f"as it is; pass {argument}=None to have a copy of the policy sharing its first layers",
                UserWarning,
                stacklevel=2,
            )
        if ref_model is policy:
            raise ValueError(
                f"{argument} must not be the policy itself; pass None to let the trainer build one"
            )
        if not isinstance(ref_model, nn.Module):
            raise TypeError(f"{argument} must be a torch.nn.Module or None, got {type(ref_model).__name__}")
        return Reference("model", ref_model.eval().requires_grad_(False))
    peft_model = peft_model_of(policy)
    if peft_model is None:
        return Reference("model", create_reference_model(policy, num_shared_layers, pattern))
    if num_shared_layers is not None:
        warnings.warn(
            "num_shared_layers is ignored for a PEFT model: its reference already shares all base weights",
            stacklevel=2,
        )
    if adapter_name in peft_model.peft_config:
        return Reference("adapter", adapter_name=adapter_name)
    return Reference("base")


@contextlib.contextmanager
def reference_context(
    model: nn.Module, ref_model: nn.Module | None = None, reference_adapter_name: str = REFERENCE_ADAPTER_NAME
) -> Iterator[nn.Module]:
    """Yield the module to call for reference log-probabilities, with gradients off (`choose_reference`).

    Unlike `choose_reference`, never copies: a model without adapters needs `ref_model`.
    """
    if ref_model is None and peft_model_of(model) is None:
        raise ValueError(
            f"{type(model).__name__} is not a PEFT model, so it holds no reference inside it; pass "
            "ref_model=create_reference_model(model)"
        )
    with choose_reference(model, ref_model, adapter_name=reference_adapter_name)(model) as acting:
        yield acting


class AdapterReference(nn.Module):
    """A PEFT policy seen as its reference module (for code that wants a callable). Holds no weights."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        object.__setattr__(self, "_policy", policy)  # not a submodule: parameters() stays empty
        object.__setattr__(self, "_reference", choose_reference(policy))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._reference(self._policy) as model:
            return model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._reference(self._policy) as model:
            return model.generate(*args, **kwargs)

    @property
    def config(self) -> Any:
        return self._policy.config


def _layer_regex(pattern: str) -> re.Pattern[str]:
    if pattern.count("{layer}") != 1:
        raise ValueError(
            f"pattern must contain '{{layer}}' exactly once, e.g. 'model.layers.{{layer}}'; got {pattern!r}"
        )
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
    """A frozen (eval-mode, no-grad) reference module for `model` (`choose_reference` wraps it).

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
                "num_shared_layers is ignored for a PEFT model: "
                "its reference already shares all base weights",
                stacklevel=2,
            )
        return AdapterReference(model)
    if num_shared_layers is None:
        ref = copy.deepcopy(model)
    else:
        if (
            isinstance(num_shared_layers, bool)
            or not isinstance(num_shared_layers, int)
            or num_shared_layers < 1
        ):
            raise ValueError(
                "num_shared_layers must be a positive integer (or None for a full copy), "
                f"got {num_shared_layers!r}"
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
    "Reference",
    "choose_reference",
    "count_shared_parameters",
    "create_reference_model",
    "reference_context",
    "shared_parameter_names",
    "unique_parameter_bytes",
]


@torch.no_grad()
def mix_into_reference(reference: nn.Module, policy: nn.Module, alpha: float) -> None:
    """TR-DPO's soft update, parameter by parameter: ref <- alpha * policy + (1 - alpha) * ref.

    The two networks must have the same parameters in the same order; the reference keeps its dtype.
    """
    ref_params, policy_params = list(reference.parameters()), list(policy.parameters())
    if len(ref_params) != len(policy_params):
        raise ValueError(
            f"cannot sync the reference: it has {len(ref_params)} parameter tensors, the policy "
            f"{len(policy_params)}; sync_ref_model needs a reference of the policy's architecture"
        )
    for ref_param, param in zip(ref_params, policy_params):
        ref_param.mul_(1 - alpha).add_(param.to(ref_param.dtype), alpha=alpha)
