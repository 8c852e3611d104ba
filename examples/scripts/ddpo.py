"""TRL's `examples/scripts/ddpo.py` path for DDPO: the same flags as `rlhfkit ddpo`.

python examples/scripts/ddpo.py --help
"""

import sys

from rlhfkit.commands.ddpo import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
