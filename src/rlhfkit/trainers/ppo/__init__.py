"""Classic PPO for language models with a value head (Ziegler et al. 2019; Stiennon et al. 2020).

Where each part of a step lives:
  trainer.py         `PPOTrainer`: construction, the numbered `step()` and the helpers each number calls
  construction.py    what `__init__` assembles: Accelerator, default optimizer, KL controller, DataLoader
  generation.py      `generate()`: batched sampling of the policy (and reference) responses
  update.py          the PPO epochs: clipped policy and value losses over shuffled minibatches
  trl_methods.py     TRL's finer-grained methods (`loss`, `train_minibatch`, ...) as thin wrappers
  tracking.py        `record_step_stats`, `gather_stats` and `log_stats` (the trackers of `log_with`)
  saving.py          save_pretrained, push_to_hub, model card, resumable checkpoints
  config.py          `PPOConfig` and its derived local/global batch sizes
  inputs.py          validation of what users pass to `step()` and `generate()`
  stats.py           the statistics a step returns and the trackers receive
  sampling_cache.py  old logprobs and values kept from `generate()` for `step()` to reuse
"""

from rlhfkit.trainers.ppo.config import PPOConfig
from rlhfkit.trainers.ppo.trainer import PPOTrainer

__all__ = ["PPOConfig", "PPOTrainer"]
