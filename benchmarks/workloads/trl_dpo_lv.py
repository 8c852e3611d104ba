"""trl: the "dpo-lv" workload, "dpo" at issue 16's large-vocabulary settings (see trl_dpo.py)."""

from trl_dpo import main

if __name__ == "__main__":
    main("dpo-lv")
