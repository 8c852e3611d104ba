"""The policy's weights as an inference engine loads them: a transformers checkpoint's names and tensors.

A trainer's model is often wrapped (value head, PEFT) and LoRA keeps its update beside the frozen
weight. An engine such as vLLM loads plain checkpoints, so `engine_weights` hands out what
`merge_and_unload()` then `state_dict()` would give, computed on the fly: W + scale * B @ A for each
LoRA layer (its active adapters), the active copy of each `modules_to_save` module, and nothing of the
adapters themselves. The model is not touched, so the adapters keep training, and the base weight is
never merged and unmerged in place (which would drift it by rounding each time).

A ZeRO-3 or FSDP2 model keeps only a shard of each weight: `engine_weights_by_module` gathers it one
module (FSDP2: one tensor; a LoRA layer: its base weight with its adapters) at a time while the weights
are sent, so a sync never holds the whole model gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

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
    wrappers = _save_wrappers(net)
    deltas = {f"{name}.weight": layer for name, layer in _lora_layers(net).items()}
    for key, tensor in net.state_dict().items():
        name = _checkpoint_name(key, wrappers)
        if name is None:
            continue
        delta = _merged_delta(deltas[name], name) if name in deltas and ".base_layer." in key else None
        yield name, tensor, tensor.detach() if delta is None else tensor.detach() + delta.to(tensor.dtype)


@torch.no_grad()
def engine_weights_by_module(
    model: nn.Module, gather: Callable[[list[nn.Parameter]], AbstractContextManager], budget: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """`engine_weights` of a sharded model (ZeRO-3, FSDP2), gathered a module at a time, never all at once.

    `gather(params)` makes `params` whole inside its block (a collective: every process must walk the
    same modules); FSDP2's DTensors are made whole one at a time as they are handed out. A module whose
    whole weights fit in `budget` bytes is gathered at once, a larger one holds only its own weights and
    its children are visited in turn; a tensor must be copied before the next one is asked for. A LoRA
    layer is always gathered whole, its adapters with its base weight: it is sent merged, as
    `engine_weights` does, and its adapters are not sent.
    """
    peft = peft_model_of(model)
    net = peft.get_base_model() if peft is not None else generating_module(model)
    wrappers = _save_wrappers(net) if peft is not None else {}
    lora = _lora_layers(net) if peft is not None else {}
    entries: list[tuple[str, nn.Module, str]] = []  # (state-dict key, owner, attribute), each tensor once
    seen: set[int] = set()
    for prefix, module in net.named_modules(remove_duplicate=False):
        own = [(k, t) for k, t in module._parameters.items() if t is not None]
        own += [
            (k, t)
            for k, t in module._buffers.items()
            if t is not None and k not in module._non_persistent_buffers_set
        ]
        for attr, tensor in own:
            if id(tensor) not in seen:  # a tied weight comes once, under its first name
                seen.add(id(tensor))
                entries.append((f"{prefix}.{attr}" if prefix else attr, module, attr))
    whole_units = {id(layer) for layer in lora.values()}
    for members in _gather_units(net, budget, entries, whole_units):
        params = [getattr(owner, attr) for _, owner, attr in members]
        with gather([p for p in params if isinstance(p, nn.Parameter)]):
            for (key, _, _), tensor in zip(members, params):
                name = _checkpoint_name(key, wrappers) if peft is not None else key
                if name is None:  # an adapter's own tensor, or an inactive modules_to_save copy
                    continue
                layer = lora.get(name.removesuffix(".weight")) if key.endswith(".base_layer.weight") else None
                delta = None if layer is None else _merged_delta(layer, name)
                if delta is None:
                    yield name, _whole(tensor)
                else:  # under FSDP2 the delta of sharded adapters is a DTensor too
                    yield name, _whole(tensor) + _whole(delta).to(tensor.dtype)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` whole and detached: an FSDP2 DTensor shard is all-gathered here (a collective)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.detach()


def _save_wrappers(net: nn.Module) -> dict[str, str]:
    """Prefix of each PEFT `modules_to_save` wrapper inside `net` -> its active adapter's name."""
    from peft.utils import ModulesToSaveWrapper

    wrappers = {
        name: module.active_adapter
        for name, module in net.named_modules()
        if isinstance(module, ModulesToSaveWrapper)
    }
    return {k: v[0] if isinstance(v, list) else v for k, v in wrappers.items()}


def _full_bytes(params: Iterator[nn.Parameter]) -> int:
    """Bytes of `params` when whole (ZeRO-3 keeps a shard; `ds_numel` is the whole size)."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in params)


def _gather_units(
    net: nn.Module, budget: int, entries: list[tuple[str, nn.Module, str]], keep_whole: set[int] = frozenset()
) -> list[list[tuple[str, nn.Module, str]]]:
    """`entries` grouped into the units gathered together: whole modules of at most `budget` bytes (or
    whose id is in `keep_whole`), else a module's own tensors alone (its children visited in turn); in the
    model's order."""
    unit_of: dict[int, int] = {}
    count = 0

    def visit(module: nn.Module) -> None:
        nonlocal count
        whole = id(module) in keep_whole or _full_bytes(module.parameters()) <= budget
        for inner in module.modules() if whole else [module]:
            unit_of.setdefault(id(inner), count)
        count += 1
        if not whole:
            for child in module.children():
                visit(child)

    visit(net)
    units: dict[int, list] = {}
    for entry in entries:
        units.setdefault(unit_of[id(entry[1])], []).append(entry)
    return [units[k] for k in sorted(units)]
