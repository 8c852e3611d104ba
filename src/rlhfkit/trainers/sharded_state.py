"""Checkpoints of a model sharded by FSDP2: whole tensors gathered from the shards, and shards cut from them.

Under FSDP2 each rank holds a slice of every weight and of the optimizer's state. Saving is therefore a
collective (every rank calls it, in the same order) that leaves whole tensors for the main process to write,
in the files of an unsharded run, so a single process loads them. Loading gives each rank its slice of the
whole tensors that every rank has read.

Each process also draws its own random numbers: `rng_state` takes one process's state, for it to restore alone.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def process_rank() -> tuple[int, int]:
    """This process's rank and the number of processes (0 and 1 outside torch.distributed)."""
    dist = torch.distributed
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG a training step draws from (python, numpy, torch, CUDA, and the trainer's own generators)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in (generators or {}).items():
        g.set_state(state["generators"][name])


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
