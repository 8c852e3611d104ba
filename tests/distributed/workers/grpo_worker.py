"""Worker: GRPOTrainer on 2 gloo processes.

A. one update on each rank's half of a fixed rollout (SGD), for several loss types: the same step as one
   process on the whole rollout, since every loss is normalised over the whole step;
B. a full `train()` of 2 updates: replicas stay identical, and the reward metric covers both ranks.
C. dynamic sampling keeps the ranks in step (the same number of sampling rounds).
With `--fsdp` the policy is sharded by accelerate's FSDP2.
"""

import sys
import tempfile

from launch import save_result

from workers.grpo_fixtures import LOSS_TYPES, flat_params, grpo_trainer, synthetic_grpo_rollout

settings = {}
if "--fsdp" in sys.argv:  # the policy sharded by accelerate's FSDP2; parameters gathered whole to compare
    from fsdp_cpu import FSDP2_ARGS, full_params, is_sharded

    settings, flat_params = FSDP2_ARGS, full_params
out = tempfile.mkdtemp()
result = {"step_params": {}, "step_loss": {}}

for loss_type in LOSS_TYPES:
    beta = 0.1 if loss_type == "dapo" else 0.0
    trainer = grpo_trainer(out, per_device=2, loss_type=loss_type, beta=beta, **settings)
    rank = trainer.accelerator.process_index
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    model, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    rollout = synthetic_grpo_rollout(trainer.accelerator.unwrap_model(model), slice(4 * rank, 4 * rank + 4))
    stats = trainer._optimize(model, rollout)
    result["step_params"][loss_type] = flat_params(trainer.accelerator.unwrap_model(model)).tolist()
    result["step_loss"][loss_type] = stats["loss"]

result["sharded"] = bool(settings) and is_sharded(trainer.model)
trainer = grpo_trainer(out, per_device=2, learning_rate=1e-2, **settings)
trainer.train()
params = flat_params(trainer.model)
everyone = trainer.accelerator.gather(params[None])
result["max_rank_diff"] = (everyone - everyone[0]).abs().max().item()
result["local_scores"] = trainer._buffer.scores.tolist()
result["reward_metric"] = trainer.state.log_history[-2]["reward"]  # [-1]: the summary
result["world"] = trainer.accelerator.num_processes

# C. dynamic sampling: every rank samples as many rounds as the rank that is shortest of useful groups
trainer = grpo_trainer(
    out, per_device=2, dynamic_sampling=True, max_sampling_rounds=4, max_steps=1, **settings
)
trainer.train()
result["prompt_batches"] = trainer._prompt_batches
save_result(result)
