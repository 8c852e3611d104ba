"""rlhfkit: RLOOTrainer with TRL 0.11's settings, 4 PPO epochs per update (see _rloo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _rloo_loop import run

    from rlhfkit import RLOOConfig, RLOOTrainer

    run(args, "rlhfkit", "rloo-old", 4, RLOOConfig, RLOOTrainer)
