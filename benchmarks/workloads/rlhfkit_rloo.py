"""rlhfkit: RLOOTrainer with one optimizer step per 16 completions, as the newest TRL (see _rloo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _rloo_loop import run

    from rlhfkit import RLOOConfig, RLOOTrainer

    run(args, "rlhfkit", "rloo", 1, RLOOConfig, RLOOTrainer)
