"""TRL 0.11.4: the classic PPO generate/step loop (see _ppo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _ppo_loop import run
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    run(args, "trl", PPOConfig, PPOTrainer, AutoModelForCausalLMWithValueHead)
