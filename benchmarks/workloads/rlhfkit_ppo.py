"""rlhfkit: the classic PPO generate/step loop (see _ppo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _ppo_loop import run

    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    run(args, "rlhfkit", PPOConfig, PPOTrainer, AutoModelForCausalLMWithValueHead)
