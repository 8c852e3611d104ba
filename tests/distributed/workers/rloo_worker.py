"""Worker: RLOOTrainer on 2 gloo processes.

A. one optimisation step (step 7) on each rank's half of a fixed rollout, with SGD;
B. a full `train()` of 2 updates: replicas stay identical, and gathered stats cover both ranks;
C. SIGINT on rank 0 only: both ranks stop after the same update and one checkpoint is written, holding the
   whole trained policy.
With `--fsdp` the policy is sharded by accelerate's FSDP2 (parameters are gathered whole before they are
compared).
"""

import os
import signal
import sys
import tempfile

import torch
from launch import save_result
from rl_fixtures import flat_params, rloo_trainer, synthetic_rloo_rollout
from safetensors.torch import load_file

fsdp = "--fsdp" in sys.argv
settings = {}
if fsdp:
    from fsdp_cpu import FSDP2_ARGS, full_params, is_sharded

    settings, flat_params = FSDP2_ARGS, full_params
out = tempfile.mkdtemp()
result = {}

# A. the update from half the rollout on each of 2 ranks equals the update from all of it on 1 rank
trainer = rloo_trainer(out, per_device=2, **settings)
rank = trainer.accelerator.process_index
trainer.create_optimizer_and_scheduler(num_training_steps=1)
model, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
rollout = synthetic_rloo_rollout(trainer.accelerator.unwrap_model(model), prompts=[rank])
stats = trainer._optimize(model, rollout)
result["step_params"] = flat_params(trainer.policy).tolist()
result["sharded"] = fsdp and is_sharded(trainer.policy)
result["distributed_type"] = str(trainer.accelerator.distributed_type)
result["step_loss"] = stats["loss/policy_avg"]

# B. full training loop
trainer = rloo_trainer(out, per_device=2, learning_rate=1e-2, **settings)
trainer.train()
params = flat_params(trainer.policy)
everyone = trainer.accelerator.gather(params[None])
result["max_rank_diff"] = (everyone - everyone[0]).abs().max().item()
result["moved"] = (
    (params - flat_params(rloo_trainer(out, per_device=2, **settings).policy)).abs().max().item()
)
# stats of one more rollout: local scores, and the metric that should average over both ranks
rollout, metrics = trainer._rollout(2)
result["local_scores"] = rollout.scores.tolist()
result["gathered_scores_metric"] = metrics["objective/scores"]
result["world"] = trainer.accelerator.num_processes

# C. the stop request of one rank is shared by all
stop_dir = os.environ["RLHFKIT_DIST_OUT"] + "/stop"  # shared by both ranks, like a real output_dir
trainer = rloo_trainer(stop_dir, per_device=2, total_episodes=16, **settings)
original = trainer._rollout


def rollout_then_signal(update):
    if update == 1 and trainer.accelerator.process_index == 0:
        os.kill(os.getpid(), signal.SIGINT)
    return original(update)


trainer._rollout = rollout_then_signal
trainer.train()
result["stopped_at"] = trainer.state.global_step
result["stopped_by_signal"] = trainer.stopped_by_signal
trainer.accelerator.wait_for_everyone()
result["checkpoints"] = sorted(p for p in os.listdir(stop_dir) if "checkpoint" in p)
# the checkpoint holds the whole trained policy (under FSDP2 gathered from the shards)
saved = load_file(os.path.join(stop_dir, "checkpoint-2", "model.safetensors"))
names = [n for n, _ in trainer.policy.named_parameters()]
trained = flat_params(trainer.policy)
result["checkpoint_equals_trained"] = sorted(saved) == sorted(names) and torch.equal(
    torch.cat([saved[n].reshape(-1) for n in names]), trained
)
save_result(result)
