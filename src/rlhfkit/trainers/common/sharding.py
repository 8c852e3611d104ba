"""Models sharded across processes (DeepSpeed ZeRO-3, FSDP2): generating from them, and checkpointing them.

Generation runs a forward per new token; gathering the shards once around the whole call, not per
token, is what makes sampling from a sharded policy affordable (`generation_context`).

Checkpoints: under FSDP2 each rank holds a slice of every weight and of the optimizer's state. Saving is
therefore a collective (every rank calls it, in the same order) that leaves whole tensors for the main
process to write, in the files of an unsharded run, so a single process loads them. Loading gives each
rank its slice of the whole tensors that every rank has read.

Each process also draws its own random numbers: `rng_state` takes one process's state, for it to restore
alone. `run_together` / `save_in_phases` let every process learn at once that one of them failed its part
of a save.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch


def sharded_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True):
    """Under DeepSpeed ZeRO-3 with `gather`, a context that gathers `model`'s sharded weights once for a
    whole generation (fast; needs room for one full copy). Otherwise, and when `gather` is False (each
    layer is then gathered on use: slow, but any size fits), a no-op context. Under FSDP, see
    `fsdp_generation_context`.
    """
    if getattr(getattr(accelerator, "state", None), "fsdp_plugin", None) is not None:
        return fsdp_generation_context(accelerator, model, gather)  # FSDP's counterpart
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None or getattr(plugin, "zero_stage", None) != 3 or not gather:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


def module_gatherer(accelerator: Any) -> Callable[[list[torch.nn.Parameter]], Any] | None:
    """Under DeepSpeed ZeRO-3 or FSDP, what gathers a few sharded weights at a time (an inference engine's
    sync sends the policy one module at a time: `engine_weights_by_module`); otherwise None. FSDP2's
    DTensors are gathered one by one as they are read, so there its gather does nothing."""
    if getattr(getattr(accelerator, "state", None), "fsdp_plugin", None) is not None:
        return lambda params: contextlib.nullcontext()
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None or getattr(plugin, "zero_stage", None) != 3:
        return None
    import deepspeed

    return deepspeed.zero.GatheredParameters


@contextlib.contextmanager
def fsdp_generation_context(accelerator: Any, model: torch.nn.Module, gather: bool = True) -> Iterator[None]:
    """Under FSDP2, the weights of `model` that `generate` needs, all-gathered before it and re-sharded after.

    A value-head model generates through its inner model, past the root's forward hooks that would gather
    the root's own weights (embeddings, head): those are always gathered here. With `gather` every layer is
    gathered once for the whole generation (fast; room for one full copy); without it each layer is
    gathered on use, once per token (slow; any size fits). A no-op unless `model` is an FSDP2 module.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model._get_fsdp_state()._lazy_init()  # as the root's first forward would: the layers must not claim root
    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if gather else [model]
    if gather:
        model.set_reshard_after_forward(False)  # the layers' forward hooks keep what was gathered
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        if gather:
            model.set_reshard_after_forward(bool(accelerator.state.fsdp_plugin.reshard_after_forward))


def process_rank() -> tuple[int, int]:
    """This process's rank and the number of processes (0 and 1 outside torch.distributed)."""
    dist = torch.distributed
    return (
        (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    )


def run_together(part: Callable[[], Any], failed: Callable[[list[int]], BaseException]) -> None:
    """`part()` on this process, then one all-reduce of a failure flag where a barrier would stand.

    When any process's part raised, every process calls `failed(failed_ranks)` (to clean up) and raises at
    once, instead of the others waiting at the next collective until it times out: a failed process its own
    error, the others the one `failed` returns. Clean-up waits for that: a process that cleaned up at once
    could delete a shared folder another is still writing in.
    """
    rank, world = process_rank()
    if world == 1:
        try:
            part()
        except Exception:
            failed([rank])  # the same clean-up as with several processes
            raise
        return
    error = None
    try:
        part()
    except Exception as err:  # reported to the others first, then raised here
        error = err
    dist = torch.distributed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flags = torch.zeros(world, dtype=torch.int32, device=device)
    flags[rank] = int(error is not None)
    dist.all_reduce(flags)
    if flags.any():
        peer_error = failed(flags.nonzero().flatten().tolist())
        raise error if error is not None else peer_error


def save_in_phases(
    start: Callable[[], Any],
    add: Callable[[], Any],
    publish: Callable[[], Any],
    failed: Callable[[list[int]], BaseException],
) -> None:
    """A save shared by every process: the main one `start`s it, each (when there are several) `add`s its own
    files, the main one `publish`es. Each phase ends in `run_together`, so no process goes on before all are
    done with it, and all raise as soon as one fails."""
    rank, world = process_rank()
    run_together(start if rank == 0 else _nothing, failed)
    run_together(add if world > 1 else _nothing, failed)
    run_together(publish if rank == 0 else _nothing, failed)


def _nothing() -> None:
    """This process's share of a phase that only another process works in."""


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
    """`whole[k]` cut as `targets[k]` is sharded (a DTensor slice per rank), ready for the owner's own
    loader."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    return {
        k: distribute_tensor(whole[k].to(v.device_mesh.device_type, v.dtype), v.device_mesh, v.placements)
        if isinstance(v, DTensor)
        else whole[k]
        for k, v in targets.items()
    }


def gather_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, whole and keyed by parameter name (a collective: call on every rank). The main
    process gets it on the CPU, the others an empty dict. A plain optimizer of the same parameters, in the
    same order, loads it with `load_state_dict`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, _inner(optimizer), options=options)


def load_optimizer_state(model: torch.nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Inverse of `gather_optimizer_state`, every rank given the whole state: each keeps its slice."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, _inner(optimizer), state, options=StateDictOptions(full_state_dict=True))
