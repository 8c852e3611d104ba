"""rlhfkit: the "ppo-lv" workload, "ppo" at issue 16's large-vocabulary settings (see rlhfkit_ppo.py)."""

from rlhfkit_ppo import main

if __name__ == "__main__":
    main("ppo-lv")
