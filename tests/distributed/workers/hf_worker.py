"""Worker: Reward, SFT and DPO trainers, 2 steps each on 2 gloo processes with batch B per process."""

import tempfile

from hf_fixtures import build, flat_params, numeric_logs
from launch import save_result

result = {}
for name in ("reward", "sft", "dpo"):
    trainer = build(name, tempfile.mkdtemp(), per_device=2)
    start = flat_params(trainer.model)
    trainer.train()
    params = flat_params(trainer.model)
    everyone = trainer.accelerator.gather(params[None])
    result[name] = {
        "world": trainer.accelerator.num_processes,
        "params": params.tolist(),
        "moved": (params - start).abs().max().item(),
        "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
        "logs": numeric_logs(trainer),
    }
save_result(result)
