"""Worker: Reward, SFT and DPO trainers, 2 steps each on 2 gloo processes with batch B per process.

With `--fsdp` the trainers run under accelerate's FSDP2 (parameters sharded across the 2 ranks) instead of DDP.
"""

import sys
import tempfile

from hf_fixtures import build, flat_params, numeric_logs
from launch import save_result

fsdp = "--fsdp" in sys.argv
if fsdp:
    from fsdp_cpu import FSDP2_ARGS, full_params, is_sharded
else:
    full_params = flat_params

result = {}
for name in ("reward", "sft", "dpo"):
    trainer = build(name, tempfile.mkdtemp(), per_device=2, **(FSDP2_ARGS if fsdp else {}))
    start = flat_params(trainer.model)
    trainer.train()
    params = full_params(trainer.model)
    everyone = trainer.accelerator.gather(params[None])
    result[name] = {
        "world": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "sharded": fsdp and is_sharded(trainer.model),
        "params": params.tolist(),
        "moved": (params - start).abs().max().item(),
        "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
        "logs": numeric_logs(trainer),
    }
save_result(result)
