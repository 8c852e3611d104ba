"""Let accelerate select FSDP on CPU, for the 2-process gloo tests only. Import it before building a trainer.

accelerate 1.15 switches its state to FSDP only for GPU-like distributed types: with the CPU forced it stays
MULTI_CPU (plain DDP) and silently ignores the FSDP plugin, although torch's FSDP2 (`fully_shard`) trains on
CPU with gloo. This lifts that one gate: a MULTI_CPU state given an FSDP plugin becomes an FSDP state. Every
other step (wrapping, gradient reduce-scatter, state dicts) is accelerate's and torch's own code.
"""

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_original_init = AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _original_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        # on PartialState too: every later AcceleratorState() (accelerate makes many) copies its type
        # from there
        PartialState._shared_state["distributed_type"] = self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin


AcceleratorState.__init__ = _init_with_fsdp_on_cpu

# TrainingArguments that put the Trainer-based trainers under FSDP2
# (`fsdp_version: 2` in an accelerate config)
FSDP2_ARGS = {"fsdp": "full_shard", "fsdp_config": {"version": 2}}


def is_sharded(model) -> bool:
    """True when FSDP2 holds `model`'s parameters as DTensor shards (each rank stores only a slice)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_params(model, trainable_only: bool = False):
    """Every parameter, gathered whole (a collective: call it on every rank), flattened in
    `parameters()` order."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]
    return torch.cat([p.detach().reshape(-1) for p in full])
