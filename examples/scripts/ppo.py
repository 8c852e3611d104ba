"""TRL's `examples/scripts/ppo.py` path for PPO: the same flags as `rlhfkit ppo`.

python examples/scripts/ppo.py --help
"""

import sys

from rlhfkit.commands.ppo import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
