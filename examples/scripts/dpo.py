"""TRL's `examples/scripts/dpo.py` path for DPO: the same flags as `rlhfkit dpo`.

python examples/scripts/dpo.py --help
"""

import sys

from rlhfkit.commands.dpo import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
