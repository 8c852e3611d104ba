"""Worker: PPOTrainer on 2 gloo processes.

A. the PPO epochs on each rank's half of a fixed rollout (SGD) equal one process on all of it;
B. a full `step()` with per-rank scores: replicas stay identical and statistics cover both ranks.
With `--fsdp` the policy is sharded by accelerate's FSDP2 instead of replicated (parameters are gathered whole
before they are compared), and C. greedy generation with the sharded policy is recorded.
"""

import sys

import torch
from launch import save_result
from rl_fixtures import fixed_ppo_batch, flat_trainable, ppo_rank_rollout, ppo_trainer

fsdp = "--fsdp" in sys.argv
config_kw = {"max_grad_norm": 0.05}  # binds (the gradient norm is ~6): clipping of averaged/sharded gradients
if fsdp:
    from accelerate import FullyShardedDataParallelPlugin
    from fsdp_cpu import full_params, is_sharded

    # as examples/accelerate_configs/fsdp.yaml: each decoder layer its own FSDP unit inside the root's
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    config_kw["accelerator_kwargs"] = {"fsdp_plugin": plugin}
    flat_trainable = lambda model: full_params(model, trainable_only=True)  # noqa: E731

result = {}
trainer = ppo_trainer(batch_size=2, **config_kw)
rank = trainer.accelerator.process_index
trainer._update(fixed_ppo_batch(trainer, rows=[2 * rank, 2 * rank + 1]))
result["epoch_params"] = flat_trainable(trainer.model).tolist()
result["sharded"] = fsdp and is_sharded(trainer.model)
result["fsdp_units"] = sum(type(m).__name__.startswith("FSDP") for m in trainer.model.modules())
result["distributed_type"] = str(trainer.accelerator.distributed_type)

trainer = ppo_trainer(batch_size=2, **config_kw)
prompts = [torch.tensor([5 + rank, 17, 42]), torch.tensor([60, 61 + rank])]
if fsdp:  # C. each rank generates for its own prompts with the sharded policy, before and after training
    result["greedy_start"] = [
        o.tolist() for o in trainer.generate(prompts, max_new_tokens=4, do_sample=False)
    ]
stats = trainer.step(*ppo_rank_rollout(rank))
params = flat_trainable(trainer.model)
everyone = trainer.accelerator.gather(params[None])
result.update(
    world=trainer.accelerator.num_processes,
    max_rank_diff=(everyone - everyone[0]).abs().max().item(),
    mean_scores=stats["ppo/mean_scores"],
    kl=stats["objective/kl"],
)
if fsdp:
    result["greedy_end"] = [o.tolist() for o in trainer.generate(prompts, max_new_tokens=4, do_sample=False)]
    trainer.config.ds3_gather_for_generation = False  # each layer gathered on use instead of all at once
    result["greedy_end_per_layer"] = [
        o.tolist() for o in trainer.generate(prompts, max_new_tokens=4, do_sample=False)
    ]
    result["step_params"] = params.tolist()
save_result(result)
