"""Trainers: one package per algorithm (its trainer, its config, its own helpers), and `common`.

  ppo/           classic PPO with a value head: the generate -> score -> `step()` loop
  rloo/          REINFORCE leave-one-out on `transformers.Trainer`
  grpo/          group relative policy optimisation and its loss variants, TRL's interface
  dpo/           direct preference optimisation
  sft/           supervised fine-tuning, with packing
  reward_model/  reward modelling on preference pairs
  ddpo/          RL for diffusion models
  common/        what several trainers share: the online RL loop, config fields and checks,
                 checkpoints, the non-finite guard and stop signals, health alarms, progress and
                 sample tables, prompt datasets, sharded models, the win-rate callback

An algorithm package imports `common` and the layers below (`core`, `rollout`, `rewards`, ...), never
another algorithm's package. The public classes are re-exported by `rlhfkit` itself.
"""
