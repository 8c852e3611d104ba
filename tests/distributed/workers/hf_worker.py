"""Worker: Reward, SFT and DPO trainers, 2 steps each on 2 gloo processes with batch B per process.

With `--fsdp` the trainers run under accelerate's FSDP2 (parameters sharded across the 2 ranks) instead of
DDP. Each trained model is then saved with `save_model`, and the file is compared with the (gathered)
parameters.
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
from hf_fixtures import build, flat_params, numeric_logs
from launch import save_result
from safetensors.torch import load_file

fsdp = "--fsdp" in sys.argv
if fsdp:
    from fsdp_cpu import FSDP2_ARGS, full_params, is_sharded
else:
    full_params = flat_params

result = {}
out = Path(os.environ["RLHFKIT_DIST_OUT"])  # shared by both ranks, like a real output_dir
for name in ("reward", "sft", "dpo"):
    trainer = build(name, tempfile.mkdtemp(), per_device=2, **(FSDP2_ARGS if fsdp else {}))
    start = flat_params(trainer.model)
    trainer.train()
    params = full_params(trainer.model)
    everyone = trainer.accelerator.gather(params[None])
    trainer.save_model(
        str(out / name)
    )  # every rank calls it; under FSDP2 the shards are gathered for the file
    trainer.accelerator.wait_for_everyone()
    saved = load_file(str(out / name / "model.safetensors"))
    names = [n for n, _ in trainer.model.named_parameters()]
    result[name] = {
        "world": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "sharded": fsdp and is_sharded(trainer.model),
        "params": params.tolist(),
        "moved": (params - start).abs().max().item(),
        "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
        "logs": numeric_logs(trainer),
        "saved_equals_trained": sorted(saved) == sorted(names)
        and torch.equal(torch.cat([saved[n].reshape(-1) for n in names]), params),
    }
save_result(result)
