"""Worker: PPOTrainer saving under FSDP2 on 2 gloo processes, into the folder given as the first argument.

A. one `step()`, then `save_pretrained(<folder>/pretrained)` and `save_checkpoint(<folder>/checkpoint)`;
   rank 0 also writes the parameters it gathered whole at that point to `<folder>/gathered.safetensors`,
   for the test to compare a single-process reload with;
B. the run goes on for one more step; a new sharded trainer loads the checkpoint and takes the same step: both
   must end with equal parameters (weights and Adam's moments were restored, each rank its own shard).
"""

import sys
from pathlib import Path

import torch
from accelerate import FullyShardedDataParallelPlugin
from fsdp_cpu import full_params, is_sharded
from launch import save_result
from rl_fixtures import ppo_rank_rollout, ppo_trainer
from safetensors.torch import save_file

folder = Path(sys.argv[1])


def sharded_trainer():
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    return ppo_trainer(batch_size=2, adam=True, accelerator_kwargs={"fsdp_plugin": plugin})


trainer = sharded_trainer()
rank = trainer.accelerator.process_index
trainer.step(*ppo_rank_rollout(rank))
saved = full_params(trainer.model)
everyone = trainer.accelerator.gather(saved[None])
trainer.save_pretrained(str(folder / "pretrained"))
trainer.save_checkpoint(str(folder / "checkpoint"))
if rank == 0:
    save_file({"params": saved}, str(folder / "gathered.safetensors"))

trainer.step(*ppo_rank_rollout(rank + 2))  # B. the uninterrupted run goes on ...
continued = full_params(trainer.model)
resumed = sharded_trainer()  # ... and so does a new run from the checkpoint
resumed.load_checkpoint(str(folder / "checkpoint"))
loaded = full_params(resumed.model)
resumed.step(*ppo_rank_rollout(rank + 2))
save_result({
    "sharded": is_sharded(trainer.model) and is_sharded(resumed.model),
    "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
    "loaded_equals_saved": torch.equal(loaded, saved),
    "moved_after_save": (continued - saved).abs().max().item(),
    "resumed_minus_continued": (full_params(resumed.model) - continued).abs().max().item(),
    "resumed_step": resumed.current_step,
})  # fmt: skip
