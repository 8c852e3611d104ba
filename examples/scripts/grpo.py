"""TRL's GRPO script path: the same flags as `rlhfkit grpo`.

python examples/scripts/grpo.py --help
"""

import sys

from rlhfkit.commands.grpo import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
