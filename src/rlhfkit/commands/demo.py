"""`rlhfkit demo`: SFT -> reward model -> RL -> gold-judge evaluation, offline, in minutes on a CPU.

    rlhfkit demo                          # RLOO, default size, ./outputs/demo
    rlhfkit demo --algo ppo --seed 1      # reuses base/SFT/preferences/reward model of an earlier run
    rlhfkit demo --size tiny --output_dir /tmp/demo --fresh
    rlhfkit demo --task addition          # exact reward, no judge: SFT warm start -> GRPO
    rlhfkit demo --task calculator        # the same with a multiply tool: GRPO with tools=

`--task addition` is described in docs/verifiable_task.md, `--task calculator` in docs/agent_task.md.

Every DemoConfig field is a flag; `--config file.yaml` supplies defaults.
"""

from __future__ import annotations

from rlhfkit.commands._args import parse_args, run_main

PROG = "rlhfkit demo"


def _body(argv: list[str] | None) -> int:
    from rlhfkit.demo import DemoConfig, run_demo

    (config,) = parse_args((DemoConfig,), argv, PROG, "Offline RLHF demo: SFT -> reward model -> RL -> judge")
    run_demo(config)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _body, argv)
