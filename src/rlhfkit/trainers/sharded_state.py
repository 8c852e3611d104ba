"""Checkpoints of a model sharded by FSDP2: whole tensors gathered from the shards, and shards cut from them.

Under FSDP2 each rank holds a slice of every weight and of the optimizer's state. Saving is therefore a
collective (every rank calls it, in the same order) that leaves whole tensors for the main process to write,
in the files of an unsharded run, so a single process loads them. Loading gives each rank its slice of the
whole tensors that every rank has read.
"""

from __future__ import annotations

from typing import Any

import torch


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one


def gather_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with every DTensor replaced by the whole tensor (one all-gather each: call on every rank)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}


def shard_like(targets: dict[str, Any], whole: dict[str, torch.Tensor]) -> dict[str, Any]:
    """`whole[k]` cut as `targets[k]` is sharded (a DTensor slice per rank), ready for the owner's own loader."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    return {
        k: distribute_tensor(whole[k].to(v.device_mesh.device_type, v.dtype), v.device_mesh, v.placements)
        if isinstance(v, DTensor) else whole[k]
        for k, v in targets.items()
    }


def gather_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, whole and keyed by parameter name (a collective: call on every rank). The main
    process gets it on the CPU, the others an empty dict. A plain optimizer of the same parameters, in the same
    order, loads it with `load_state_dict`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, _inner(optimizer), options=options)


def load_optimizer_state(model: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Inverse of `gather_optimizer_state`, every rank given the whole state: each keeps its slice."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, _inner(optimizer), state, options=StateDictOptions(full_state_dict=True))
