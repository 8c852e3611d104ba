"""trl: the "rloo-lv" workload, "rloo" at issue 16's large-vocabulary settings (see trl_rloo.py)."""

from trl_rloo import main

if __name__ == "__main__":
    main("rloo-lv")
