"""`rlhfkit <command> [flags]`: one entry point, one module per command.

Each command lives in `rlhfkit.commands.<name>` and exposes `main(argv: list[str]) -> int`.
Modules are imported only when their command runs, so `rlhfkit --help` stays fast.
"""

from __future__ import annotations

import importlib
import logging
import sys

# command -> (module, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("rlhfkit.commands.demo", "run the complete offline RLHF pipeline (SFT -> reward model -> RL)"),
    "ppo": ("rlhfkit.commands.ppo", "classic PPO loop on a built-in task or local data"),
    "rloo": ("rlhfkit.commands.rloo", "REINFORCE leave-one-out training (RLOOTrainer)"),
    "grpo": ("rlhfkit.commands.grpo", "group relative policy optimisation (GRPOTrainer)"),
    "reward": ("rlhfkit.commands.reward", "train a reward model on preference pairs"),
    "sft": ("rlhfkit.commands.sft", "supervised fine-tuning"),
    "dpo": ("rlhfkit.commands.dpo", "direct preference optimisation"),
    "kto": ("rlhfkit.commands.kto", "Kahneman-Tversky optimisation on labelled completions"),
    "ddpo": ("rlhfkit.commands.ddpo", "RL fine-tuning of a diffusion model"),
    "judge": ("rlhfkit.commands.judge", "win rate of a policy against reference completions, by a judge"),
    "vllm-serve": ("rlhfkit.commands.vllm_serve", "serve a model with vLLM for the trainers to sample from"),
    "tiny-models": ("rlhfkit.commands.tiny_models", "build the offline tiny models and tokenizer"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: rlhfkit <command> [flags]   (rlhfkit <command> --help for its flags)", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        from rlhfkit import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rlhfkit: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    # peft imports bitsandbytes when it is installed; on an AVX512-BF16 CPU its import logs that an optional
    # 4-bit kernel package is missing, a line no rlhfkit command has use for
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
