"""TRL's `examples/scripts/evals/judge_tldr.py` path (seed 000's evaluation): the same flags as
`rlhfkit judge`.

    python examples/scripts/evals/judge_tldr.py --model_name_or_path runs/rloo --judge_model ./judge-llm \
        --num_examples 1000 --dataset_name ./tldr_validation.jsonl
"""

import sys

from rlhfkit.commands.judge import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
