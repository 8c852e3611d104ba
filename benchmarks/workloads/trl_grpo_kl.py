"""Newest TRL: GRPOTrainer as trl_grpo.py with beta=0.04 (a frozen reference model; see _grpo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _grpo_loop import run
    from trl import GRPOConfig, GRPOTrainer
    from trl_grpo import TRL_SETTINGS

    run(args, "trl", "grpo-kl", GRPOConfig, GRPOTrainer, **TRL_SETTINGS)
