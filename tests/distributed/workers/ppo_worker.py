"""Worker: PPOTrainer on 2 gloo processes.

A. the PPO epochs on each rank's half of a fixed rollout (SGD) equal one process on all of it;
B. a full `step()` with per-rank scores: replicas stay identical and statistics cover both ranks.
"""

import torch
from launch import save_result
from rl_fixtures import fixed_ppo_batch, flat_trainable, ppo_trainer

result = {}
trainer = ppo_trainer(batch_size=2)
rank = trainer.accelerator.process_index
trainer._update(fixed_ppo_batch(trainer, rows=[2 * rank, 2 * rank + 1]))
result["epoch_params"] = flat_trainable(trainer.model).tolist()

trainer = ppo_trainer(batch_size=2)
g = torch.Generator().manual_seed(100 + rank)  # each rank samples its own rollout
queries = [torch.randint(5, 200, (3,), generator=g) for _ in range(2)]
responses = [torch.randint(5, 200, (4,), generator=g) for _ in range(2)]
scores = [torch.tensor(10.0 * rank + 1.0), torch.tensor(10.0 * rank + 2.0)]
stats = trainer.step(queries, responses, scores)
params = flat_trainable(trainer.model)
everyone = trainer.accelerator.gather(params[None])
result.update(
    world=trainer.accelerator.num_processes,
    max_rank_diff=(everyone - everyone[0]).abs().max().item(),
    mean_scores=stats["ppo/mean_scores"],
    kl=stats["objective/kl"],
)
save_result(result)
