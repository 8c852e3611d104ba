"""`rlhfkit demo`: the offline, laptop-scale RLHF pipeline (SFT -> reward model -> RL -> gold judge).

Modules: `config` (DemoConfig and size presets), `cache` (cached stages with done-markers),
`stages` (base model, SFT, preference pairs, reward model), `rl` (one function per algorithm),
`evaluation` (win rate and friends), `report` and `plots`, and `pipeline.run_demo` tying them together;
`dependencies` checks the optional `demo` extra before the first stage.
`--task addition` runs `verifiable` instead (SFT warm start -> GRPO on an exact reward -> held-out accuracy,
reported by `verifiable_report`); `--task calculator` too, with a tool (episodes, accuracy with and without
tools, its report: `tool_use`).
Heavy libraries load inside the functions that use them.
"""

from rlhfkit.demo.config import ALGOS, PRESETS, DemoConfig

__all__ = ["ALGOS", "PRESETS", "DemoConfig", "run_demo"]


def run_demo(cfg: DemoConfig):
    """Run the demo pipeline (see `rlhfkit.demo.pipeline`), after checking the `demo` extra is installed."""
    from rlhfkit.demo.dependencies import check_demo_dependencies

    check_demo_dependencies(cfg.task)  # before any stage: a missing module fails now, not minutes in
    from rlhfkit.demo.pipeline import run_demo as _run

    return _run(cfg)
