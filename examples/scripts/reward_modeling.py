"""TRL's `examples/scripts/reward_modeling.py` path for reward-model training: the same flags as
`rlhfkit reward`.

python examples/scripts/reward_modeling.py --help
"""

import sys

from rlhfkit.commands.reward import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
