"""TRL 0.11.4: the classic PPO generate/step loop (see _ppo_loop.py)."""

from _common import workload_args


def main(workload: str = "ppo") -> None:
    args = workload_args(__doc__)
    from _ppo_loop import run
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    run(args, "trl", PPOConfig, PPOTrainer, AutoModelForCausalLMWithValueHead, workload)


if __name__ == "__main__":
    main()
