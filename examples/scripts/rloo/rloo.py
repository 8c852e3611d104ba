"""TRL's `examples/scripts/rloo/rloo.py` path (seed 000's command): the same flags as `rlhfkit rloo`.

python examples/scripts/rloo/rloo.py --help
"""

import sys

from rlhfkit.commands.rloo import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
