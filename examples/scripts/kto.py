"""TRL's `examples/scripts/kto.py` path for KTO: the same flags as `rlhfkit kto`.

python examples/scripts/kto.py --help
"""

import sys

from rlhfkit.commands.kto import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
