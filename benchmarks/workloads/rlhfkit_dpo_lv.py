"""rlhfkit: the "dpo-lv" workload, "dpo" at issue 16's large-vocabulary settings (see rlhfkit_dpo.py)."""

from rlhfkit_dpo import main

if __name__ == "__main__":
    main("dpo-lv")
