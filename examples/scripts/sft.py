"""TRL's `examples/scripts/sft.py` path for supervised fine-tuning: the same flags as `rlhfkit sft`.

python examples/scripts/sft.py --help
"""

import sys

from rlhfkit.commands.sft import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
