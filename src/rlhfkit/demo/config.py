"""DemoConfig: every knob of `rlhfkit demo`, with size presets.

Size fields default to None and are filled from the `--size` preset, so a flag given on the command
line always wins over the preset. The "default" preset is the laptop demo (minutes on 2 CPU cores);
"tiny" is the CI smoke size.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from rlhfkit.trainers.common.config import check_positive_integers, check_positive_numbers, option

ALGOS = ("rloo", "ppo", "ppo-multi-adapter", "dpo")
# --task -> the RL algorithms it runs, the first being its default: sentiment learns from a reward model,
# a verifiable task (rlhfkit.demo.verifiable) from its exact reward with GRPO
TASK_ALGOS: dict[str, tuple[str, ...]] = {"sentiment": ALGOS, "addition": ("grpo",), "calculator": ("grpo",)}
PPO_MINI_BATCHES = 4  # PPO mini-batches per rollout batch (rl_epochs passes over each)

# preset -> values for the size fields left unset on the command line; "tiny" is "default" with
# fewer reviews, SFT steps and RL updates, and shorter completions
_LAPTOP: dict[str, Any] = dict(
    sft_num_reviews=4000,
    sft_steps=200,
    sft_batch_size=16,
    sft_seq_length=128,
    sft_learning_rate=3e-3,
    pref_num_prompts=1536,
    rm_epochs=3,
    rm_batch_size=16,
    rm_learning_rate=2e-3,
    rl_updates=40,
    rl_batch_size=64,
    rl_learning_rate=1e-4,
    rl_epochs=2,
    dpo_epochs=2,
    dpo_learning_rate=3e-4,
    response_length=48,
    eval_num_prompts=256,
    temperature=0.7,
    kl_coef=0.15,  # 0.05 let RLOO collapse onto a few phrases the reward model likes (distinct-2 halved)
)
PRESETS: dict[str, dict[str, Any]] = {
    "default": _LAPTOP,
    "tiny": {
        **_LAPTOP,
        "sft_num_reviews": 2000,
        "sft_steps": 150,
        "rl_updates": 20,
        "rl_batch_size": 48,
        "rl_learning_rate": 2e-4,
        "response_length": 32,
        "eval_num_prompts": 128,
        "kl_coef": 0.05,  # 20 short updates: a weaker penalty lets the smoke run show learning
    },
}
# --task addition: a short SFT warm start (imperfect on purpose), then GRPO on the exact reward; the fields
# only the sentiment pipeline reads keep the laptop values
_ADDITION: dict[str, Any] = {
    **_LAPTOP,
    "sft_steps": 1500,
    "sft_batch_size": 64,
    "sft_learning_rate": 1e-3,
    "sft_target_accuracy": 0.4,
    "rl_updates": 150,
    "rl_batch_size": 256,
    "rl_learning_rate": 1e-4,
    "rl_epochs": 1,
    # RL samples close to the greedy answer: 1.0 lifted greedy accuracy ~20 points, 0.4 ~30
    "temperature": 0.4,
    "kl_coef": 0.0,
    "response_length": 5,
    "eval_num_prompts": 1600,
}
# --task calculator: an SFT warm start on a few tool-call transcripts (stopped early on purpose), then GRPO
# with the multiply tool; a completion holds the call, the tool's result and the answer
_CALCULATOR: dict[str, Any] = {
    **_ADDITION,
    "sft_steps": 400,
    "sft_batch_size": 32,
    "sft_learning_rate": 1e-3,
    "sft_target_accuracy": 0.3,
    # 100 steps at 0.7: 2-5 points over 60 at 0.4 on seeds 0-2 (fewer wrong calls; docs/agent_task.md);
    # 100 at 0.4 and a learning rate of 2e-4 did not beat 60 steps
    "rl_updates": 100,
    "rl_batch_size": 128,
    "rl_learning_rate": 1e-4,
    "temperature": 0.7,
    "response_length": 96,
    "eval_num_prompts": 512,
}
TASK_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "sentiment": PRESETS,
    "addition": {
        "default": _ADDITION,
        "tiny": {**_ADDITION, "sft_steps": 60, "rl_updates": 4, "rl_batch_size": 32, "eval_num_prompts": 64},
    },
    "calculator": {
        "default": _CALCULATOR,
        "tiny": {
            **_CALCULATOR,
            "sft_steps": 40,
            "rl_updates": 3,
            "rl_batch_size": 16,
            "eval_num_prompts": 32,
        },
    },
}


def preset_size(help: str) -> Any:
    """A size field: left unset (None), it takes the value of the `--size` preset (`PRESETS`)."""
    return option(None, f"{help} Default: the --size preset's.")


# size fields that must be >= 1, and rates and scales that must be > 0 (after the presets fill them)
POSITIVE_INTEGERS = (
    "sft_num_reviews",
    "sft_steps",
    "sft_batch_size",
    "pref_num_prompts",
    "rm_epochs",
    "rm_batch_size",
    "rl_updates",
    "rl_batch_size",
    "rl_epochs",
    "dpo_epochs",
    "response_length",
    "eval_num_prompts",
)
POSITIVE_NUMBERS = (
    "sft_learning_rate",
    "rm_learning_rate",
    "rl_learning_rate",
    "dpo_learning_rate",
    "temperature",
    "dpo_beta",
)


@dataclass
class DemoConfig:
    """Flags of `rlhfkit demo`; sizes left unset come from the `--size` preset."""

    output_dir: str = option("outputs/demo", "Folder for every stage and the report.")
    task: str = option(
        "sentiment",
        f"Demo task: {', '.join(TASK_ALGOS)} (sentiment: reward model + RL; addition: exact reward + GRPO; "
        "calculator: GRPO with a multiply tool).",
    )
    algo: str | None = option(
        None,
        f"RL stage, default the task's first: {', '.join(ALGOS)} for sentiment (ppo-multi-adapter: one base, "
        "policy + reward adapters); grpo for addition and calculator.",
    )
    size: str = option("default", f"Preset for the stage sizes: {', '.join(PRESETS)} (tiny: CI).")
    seed: int = option(0, "Seed of every stage (data order, sampling, init).")
    fresh: bool = option(False, "Re-run every stage instead of reusing finished ones.")
    model: str = option(
        "llama", "Starting policy: a name from rlhfkit.testing (llama, llama-small, ...) or a local folder."
    )
    num_threads: int = option(
        1, "torch CPU threads (0: torch's default). The default 1 is fastest for models this small."
    )
    # 1. supervised fine-tuning
    sft_num_reviews: int | None = preset_size("Reviews in the SFT corpus.")
    sft_steps: int | None = preset_size("SFT optimizer steps.")
    sft_batch_size: int | None = preset_size("Packed blocks per SFT step.")
    sft_seq_length: int | None = preset_size("Tokens per packed SFT block.")
    sft_learning_rate: float | None = preset_size("SFT peak learning rate (cosine).")
    sft_target_accuracy: float | None = preset_size(
        "--task addition and calculator: stop SFT early once greedy accuracy on 256 train problems reaches "
        "this share (0: run all --sft_steps), so that RL starts from an imperfect policy; calculator keeps "
        "whichever of the two probed policies around the crossing is closer to it."
    )
    # 2. preference pairs and reward model
    pref_num_prompts: int | None = preset_size(
        "Train prompts sampled twice by the SFT policy and labelled by VADER."
    )
    pref_eval_fraction: float = option(
        0.15, "Share of the preference pairs held out to measure reward accuracy."
    )
    rm_epochs: int | None = preset_size("Reward-model epochs over the pairs.")
    rm_batch_size: int | None = preset_size("Pairs per reward-model step.")
    rm_learning_rate: float | None = preset_size("Reward-model learning rate.")
    # 3. reinforcement learning
    rl_updates: int | None = preset_size("RL updates (RLOO/PPO); each samples rl_batch_size completions.")
    rl_batch_size: int | None = preset_size("Completions per RL update.")
    rl_learning_rate: float | None = preset_size("RL learning rate.")
    rl_epochs: int | None = preset_size("Optimisation passes over each batch of rollouts.")
    rloo_k: int = option(4, "RLOO: completions per prompt.")
    num_generations: int = option(8, "GRPO (--task addition, calculator): completions per prompt, one group.")
    kl_coef: float | None = preset_size("Weight of the KL penalty to the SFT policy (GRPO's beta).")
    temperature: float | None = preset_size("Sampling temperature for RL, pairs and evaluation.")
    response_length: int | None = preset_size("Maximum new tokens per completion.")
    lora_r: int = option(16, "ppo-multi-adapter: rank of the policy and reward LoRA adapters.")
    dpo_epochs: int | None = preset_size("DPO epochs over the preference pairs.")
    dpo_beta: float = option(0.1, "DPO beta (strength of the implicit KL).")
    dpo_learning_rate: float | None = preset_size("DPO learning rate.")
    # 4. evaluation
    eval_num_prompts: int | None = preset_size("Held-out prompts judged for the win rate.")
    eval_samples_shown: int = option(6, "Side-by-side completions printed and reported.")
    curve_points: int = option(
        5, "Win-rate curve: times the RL stage judges its policy against SFT (gold judge; 0: no curve)."
    )
    curve_num_prompts: int = option(64, "Win-rate curve: held-out prompts judged at each point.")

    def __post_init__(self):
        if self.task not in TASK_ALGOS:
            raise ValueError(f"--task must be one of {', '.join(TASK_ALGOS)}, got {self.task!r}")
        if self.size not in PRESETS:
            raise ValueError(f"--size must be one of {', '.join(PRESETS)}, got {self.size!r}")
        algos = TASK_ALGOS[self.task]
        if self.algo is None:
            self.algo = algos[0]
        if self.algo not in algos:
            raise ValueError(
                f"--algo must be one of {', '.join(algos)} for --task {self.task}, got {self.algo!r}"
            )
        for name, value in TASK_PRESETS[self.task][self.size].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.validate()

    def validate(self) -> None:
        check_positive_integers(self, POSITIVE_INTEGERS, prefix="--")
        check_positive_numbers(self, POSITIVE_NUMBERS, prefix="--")
        if self.sft_seq_length < 16:
            raise ValueError(f"--sft_seq_length must be >= 16 tokens, got {self.sft_seq_length}")
        if not 0.0 < self.pref_eval_fraction < 0.5:
            raise ValueError(f"--pref_eval_fraction must be in (0, 0.5), got {self.pref_eval_fraction}")
        if self.rloo_k < 2:
            raise ValueError(
                f"--rloo_k must be >= 2 (the baseline averages the other k-1), got {self.rloo_k}"
            )
        if self.algo == "grpo" and (self.num_generations < 2 or self.rl_batch_size % self.num_generations):
            raise ValueError(
                f"--num_generations ({self.num_generations}) must be >= 2 and divide --rl_batch_size "
                f"({self.rl_batch_size}): GRPO compares the completions within each group of a prompt"
            )
        if self.algo == "rloo" and self.rl_batch_size % self.rloo_k:
            raise ValueError(
                f"--rl_batch_size ({self.rl_batch_size}) must be a multiple of --rloo_k ({self.rloo_k})"
            )
        if self.algo.startswith("ppo") and self.rl_batch_size % PPO_MINI_BATCHES:
            raise ValueError(
                f"--rl_batch_size ({self.rl_batch_size}) must be a multiple of {PPO_MINI_BATCHES} for --algo "
                f"{self.algo}: each PPO batch is split into {PPO_MINI_BATCHES} mini-batches"
            )
        if self.sft_target_accuracy is not None and not 0.0 <= self.sft_target_accuracy < 1.0:
            raise ValueError(f"--sft_target_accuracy must be in [0, 1), got {self.sft_target_accuracy}")
        if self.kl_coef < 0:
            raise ValueError(f"--kl_coef must be >= 0, got {self.kl_coef}")
        if self.num_threads < 0:
            raise ValueError(f"--num_threads must be >= 0, got {self.num_threads}")
        if self.curve_points < 0 or self.curve_num_prompts < 1:
            raise ValueError(
                f"--curve_points must be >= 0 and --curve_num_prompts >= 1, got {self.curve_points} and "
                f"{self.curve_num_prompts}"
            )
        if self.eval_samples_shown < 0:
            raise ValueError(f"--eval_samples_shown must be >= 0, got {self.eval_samples_shown}")

    def values(self, *names: str) -> dict[str, Any]:
        """The named fields as a dict (the part of the config a stage depends on)."""
        known = {f.name for f in fields(self)}
        unknown = [n for n in names if n not in known]
        if unknown:  # a typo here would silently drop a field from a stage's cache key
            raise KeyError(f"DemoConfig has no field(s) {unknown}")
        return {name: getattr(self, name) for name in names}
