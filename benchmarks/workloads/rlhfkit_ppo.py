"""rlhfkit: the classic PPO generate/step loop (see _ppo_loop.py)."""

from _common import workload_args


def main(workload: str = "ppo") -> None:
    args = workload_args(__doc__)
    from _ppo_loop import run

    from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    run(args, "rlhfkit", PPOConfig, PPOTrainer, AutoModelForCausalLMWithValueHead, workload)


if __name__ == "__main__":
    main()
