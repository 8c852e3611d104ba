"""The policy's weights as an inference engine loads them: a transformers checkpoint's names and tensors.

A trainer's model is often wrapped (value head, PEFT) and LoRA keeps its update beside the frozen
weight. An engine such as vLLM loads plain checkpoints, so `engine_weights` hands out what
`merge_and_unload()` then `state_dict()` would give, computed on the fly: W + scale * B @ A for each
LoRA layer (its active adapters), the active copy of each `modules_to_save` module, and nothing of the
adapters themselves. The model is not touched, so the adapters keep training, and the base weight is
never merged and unmerged in place (which would drift it by rounding each time).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rlhfkit.models.peft_detection import peft_model_of
from rlhfkit.rollout.streaming import generating_module


def _lora_layers(net: nn.Module) -> dict[str, nn.Module]:
    """Module name -> LoRA layer, for every LoRA layer inside `net`."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in net.named_modules() if isinstance(module, LoraLayer)}


def _merged_delta(layer: nn.Module, name: str) -> torch.Tensor | None:
    """The sum of the active adapters' weight updates of LoRA layer `layer` (None: no active update)."""
    if layer.merged or layer.disable_adapters:  # merged: already in the base weight
        return None
    deltas = []
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if layer.use_dora.get(adapter):
            raise ValueError(f"{name}: DoRA adapters cannot be merged for the engine; use plain LoRA")
        deltas.append(layer.get_delta_weight(adapter))
    return sum(deltas) if deltas else None


def _checkpoint_name(key: str, wrappers: dict[str, str]) -> str | None:
    """`key` of a PEFT-injected model under its plain checkpoint name; None for an adapter's own tensor.

    wrappers: prefix of each `modules_to_save` wrapper -> its active adapter name.
    """
    if ".lora_" in key:
        return None
    for prefix, active in wrappers.items():
        if key.startswith(prefix + "."):
            inner = key[len(prefix) + 1 :]
            copy = f"modules_to_save.{active}."
            return f"{prefix}.{inner[len(copy) :]}" if inner.startswith(copy) else None
    return key.replace(".base_layer.", ".")


@torch.no_grad()
def engine_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of every weight of the generating model inside `model`, LoRA merged.

    The names are those `save_pretrained` writes, without value-head or PEFT prefixes; tied weights
    (an lm_head sharing the input embedding) come once, under the first name, as there. Tensors are
    detached and may share storage with the model.
    """
    seen = set()
    for name, stored, tensor in _named_weights(model):
        # tied copies are found by the model's own storage: a merged tensor is a temporary, and a later
        # one may reuse the memory of one the engine has already let go
        key = (stored.data_ptr(), tuple(stored.shape))
        if stored.numel() and key in seen:
            continue
        seen.add(key)
        yield name, tensor


def _named_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(checkpoint name, the model's tensor, the tensor to send: merged where LoRA adds to it)."""
    peft = peft_model_of(model)
    net = peft.get_base_model() if peft is not None else generating_module(model)
    if peft is None:
        yield from ((key, tensor, tensor.detach()) for key, tensor in net.state_dict().items())
        return
    from peft.utils import ModulesToSaveWrapper

    wrappers = {
        name: module.active_adapter
        for name, module in net.named_modules()
        if isinstance(module, ModulesToSaveWrapper)
    }
    wrappers = {k: v[0] if isinstance(v, list) else v for k, v in wrappers.items()}
    deltas = {f"{name}.weight": layer for name, layer in _lora_layers(net).items()}
    for key, tensor in net.state_dict().items():
        name = _checkpoint_name(key, wrappers)
        if name is None:
            continue
        delta = _merged_delta(deltas[name], name) if name in deltas and ".base_layer." in key else None
        yield name, tensor, tensor.detach() if delta is None else tensor.detach() + delta.to(tensor.dtype)
