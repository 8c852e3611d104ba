"""Worker: GRPOTrainer with a tool on 2 gloo processes, on the scripted sampler of `grpo_tools_fixtures`.

A. on every rank rows alternate between calling the tool and answering at once: one update (SGD) is the
   same as one process's on the doubled batch, and the replicas stay identical;
B. rank 0's rows all call the tool, rank 1's alternate: the logged `tools/*` figures cover both ranks.
"""

import tempfile

from launch import save_result

from workers.grpo_tools_fixtures import flat_params, grpo_tools_trainer, rank, tool_metrics

out = tempfile.mkdtemp()
trainer = grpo_tools_trainer(out, per_device=4, calls=lambda i: i % 2 == 0)
trainer.train()
params = flat_params(trainer.model)
everyone = trainer.accelerator.gather(params[None])
result = {
    "world": trainer.accelerator.num_processes,
    "params": params.tolist(),
    "max_rank_diff": (everyone - everyone[0]).abs().max().item(),
    "metrics_a": tool_metrics(trainer),
}
trainer = grpo_tools_trainer(out, per_device=4, calls=lambda i: rank() == 0 or i % 2 == 0)
trainer.train()
result["metrics_b"] = tool_metrics(trainer)
save_result(result)
