"""trl: the "ppo-lv" workload, "ppo" at issue 16's large-vocabulary settings (see trl_ppo.py)."""

from trl_ppo import main

if __name__ == "__main__":
    main("ppo-lv")
