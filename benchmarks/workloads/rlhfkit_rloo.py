"""rlhfkit: RLOOTrainer with one optimizer step per 16 completions, as the newest TRL (see _rloo_loop.py)."""

from _common import workload_args


def main(workload: str = "rloo") -> None:
    args = workload_args(__doc__)
    from _rloo_loop import run

    from rlhfkit import RLOOConfig, RLOOTrainer

    run(args, "rlhfkit", workload, 1, RLOOConfig, RLOOTrainer)


if __name__ == "__main__":
    main()
