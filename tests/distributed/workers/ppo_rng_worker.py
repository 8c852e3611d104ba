"""Worker: a PPOTrainer run on 2 gloo processes (DDP) saved after step 1 and resumed for step 2, into the
folder given as the first argument. Both ranks sample responses to the same queries, so only their random
states tell them apart. The run goes on for a sampled step 2 (the uninterrupted run); then a new trainer loads
the checkpoint and takes the same sampled step 2. Both must sample the same responses and end with equal
weights.
"""

import sys
from pathlib import Path

from launch import save_result
from rl_fixtures import flat_params, ppo_rank_rollout, ppo_trainer

folder = Path(sys.argv[1])
GENERATION = {"do_sample": True, "top_k": 0, "top_p": 1.0, "max_new_tokens": 4, "return_prompt": False}


def sampled_step(trainer, rank: int) -> list[list[int]]:
    queries, _, scores = ppo_rank_rollout(0)  # the same queries on both ranks
    responses = trainer.generate(queries, **GENERATION)
    trainer.step(queries, responses, [s + rank for s in scores])
    return [r.tolist() for r in responses]


trainer = ppo_trainer(batch_size=2, adam=True)
rank = trainer.accelerator.process_index
first = sampled_step(trainer, rank)
trainer.save_checkpoint(str(folder / "checkpoint"))
saved = flat_params(trainer.model)
continued = sampled_step(trainer, rank)  # the uninterrupted run's step 2 ...
resumed = ppo_trainer(batch_size=2, adam=True)  # ... and the resumed run's (a new trainer: seeded afresh)
resumed.load_checkpoint(str(folder / "checkpoint"))
again = sampled_step(resumed, rank)
save_result({
    "world": trainer.accelerator.num_processes,
    "first": first,
    "continued": continued,
    "resumed": again,
    "resumed_step": resumed.current_step,
    "moved_in_step_2": (flat_params(trainer.model) - saved).abs().max().item(),
    "resumed_minus_continued": (flat_params(resumed.model) - flat_params(trainer.model)).abs().max().item(),
})  # fmt: skip
