"""rlhfkit: RL and preference learning for transformer language models and diffusion models.

Public names are imported lazily, so `import rlhfkit` (and `import rlhfkit.core`) needs only
torch; transformers, peft and diffusers load on first use of the class that needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    # models
    "PreTrainedModelWrapper": "rlhfkit.models.value_head",
    "AutoModelForCausalLMWithValueHead": "rlhfkit.models.value_head",
    "AutoModelForSeq2SeqLMWithValueHead": "rlhfkit.models.value_head",
    "create_reference_model": "rlhfkit.models.reference",
    # PPO
    "PPOConfig": "rlhfkit.trainers.ppo",
    "PPOTrainer": "rlhfkit.trainers.ppo",
    # RLOO
    "RLOOConfig": "rlhfkit.trainers.rloo.config",
    "RLOOTrainer": "rlhfkit.trainers.rloo.forms",
    # GRPO
    "GRPOConfig": "rlhfkit.trainers.grpo.config",
    "GRPOTrainer": "rlhfkit.trainers.grpo.trainer",
    # reward / SFT / DPO
    "RewardConfig": "rlhfkit.trainers.reward_model.config",
    "RewardTrainer": "rlhfkit.trainers.reward_model.trainer",
    "RewardDataCollatorWithPadding": "rlhfkit.data.collators",
    "DataCollatorForPreference": "rlhfkit.data.collators",
    "SFTConfig": "rlhfkit.trainers.sft.config",
    "SFTTrainer": "rlhfkit.trainers.sft.trainer",
    "dft_loss": "rlhfkit.trainers.sft.token_stats",
    "ConstantLengthDataset": "rlhfkit.data.packing",
    "DataCollatorForLanguageModeling": "rlhfkit.data.language_modeling",
    "pack_dataset": "rlhfkit.data.packing",
    "DPOConfig": "rlhfkit.trainers.dpo.config",
    "DPOTrainer": "rlhfkit.trainers.dpo.trainer",
    # KTO
    "KTOConfig": "rlhfkit.trainers.kto.config",
    "KTOTrainer": "rlhfkit.trainers.kto.trainer",
    "DataCollatorForUnpairedPreference": "rlhfkit.data.unpaired",
    "unpair_preference_dataset": "rlhfkit.data.unpaired",
    "maybe_unpair_preference_dataset": "rlhfkit.data.unpaired",
    # DDPO
    "DDPOConfig": "rlhfkit.trainers.ddpo.config",
    "DDPOTrainer": "rlhfkit.trainers.ddpo.trainer",
    "DDPOStableDiffusionPipeline": "rlhfkit.models.sd_pipeline",
    "DefaultDDPOStableDiffusionPipeline": "rlhfkit.models.sd_pipeline",
    # judges (TRL's interfaces; implementations in rlhfkit.judges)
    "BaseJudge": "rlhfkit.judges.base",
    "BasePairwiseJudge": "rlhfkit.judges.base",
    "BaseRankJudge": "rlhfkit.judges.base",
    "WinRateCallback": "rlhfkit.trainers.common.win_rate",
    # agents: tools and multi-turn episodes
    "ToolBox": "rlhfkit.agents.tools",
    "Episode": "rlhfkit.agents.episodes",
    "run_episodes": "rlhfkit.agents.rollout",
    # misc
    "AdaptiveKLController": "rlhfkit.core.kl",
    "FixedKLController": "rlhfkit.core.kl",
    "LengthSampler": "rlhfkit.rollout.generation",
    "VLLMServerBackend": "rlhfkit.rollout.vllm_client",
    "VLLMColocateBackend": "rlhfkit.rollout.vllm_colocate",
    "set_seed": "transformers",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for static analysers only
    from rlhfkit.core.kl import AdaptiveKLController, FixedKLController  # noqa: F401
