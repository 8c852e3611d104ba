"""rlhfkit: the "rloo-lv" workload, "rloo" at issue 16's large-vocabulary settings (see rlhfkit_rloo.py)."""

from rlhfkit_rloo import main

if __name__ == "__main__":
    main("rloo-lv")
