"""rlhfkit: GRPOTrainer, beta=0, 16 completions (4 prompts x 4) per optimizer step (see _grpo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _grpo_loop import run

    from rlhfkit import GRPOConfig, GRPOTrainer

    run(args, "rlhfkit", "grpo", GRPOConfig, GRPOTrainer)
