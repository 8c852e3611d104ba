"""RLOOConfig: TrainingArguments plus the REINFORCE leave-one-out options of TRL 0.x.

An "episode" is one completion. One update (one optimizer-scheduler step, one `global_step`) consumes
`batch_size` episodes: `batch_size / rloo_k` prompts per update across all processes, each sampled
`rloo_k` times. All derived sizes are computed in `compute_batch_sizes`, nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from transformers import TrainingArguments

from rlhfkit.trainers.common.config import (
    DatasetNumProc,
    GenerationOptions,
    HealthChecks,
    HFTrainerConfig,
    exact_div,
    option,
)


@dataclass
class RLOOConfig(DatasetNumProc, GenerationOptions, HealthChecks, HFTrainerConfig):
    """Configuration for `RLOOTrainer`; every `transformers.TrainingArguments` field also applies."""

    exp_name: str = option("rloo_config", "Name of this experiment (used in the run name).")
    reward_model_path: str = option(
        "EleutherAI/pythia-160m",
        "Local folder of the reward model (a sequence-classification model with one output).",
    )
    sft_model_path: str = option(
        "EleutherAI/pythia-160m",
        "Local folder of the SFT model that initialises the policy and the reference policy.",
    )
    num_ppo_epochs: int = option(
        4, "Passes over each batch of rollouts (1 with num_mini_batches=1: plain REINFORCE)."
    )
    whiten_rewards: bool = option(
        False, "Divide the RLHF rewards of a batch by their standard deviation (the mean is kept)."
    )
    kl_coef: float = option(0.05, "Weight beta of the KL penalty against the reference.")
    cliprange: float = option(0.2, "Clipping range of the sequence-level probability ratio.")
    rloo_k: int = option(2, "Completions sampled per prompt; each is baselined by the other k-1 (>= 2).")
    normalize_reward: bool = option(
        False,
        "Reinforce++: standardise the raw scores of a batch to mean 0, std 1 and clip them to "
        "[-reward_clip_range, reward_clip_range], before the KL penalty is added.",
    )
    reward_clip_range: float = option(10.0, "Clip range of the normalised scores (normalize_reward).")
    normalize_advantage: bool = option(
        False, "Reinforce++: standardise the advantages of a batch to mean 0, std 1."
    )
    token_level_kl: bool = option(
        False,
        "Apply the KL penalty per token (Reinforce++ eq. 1) instead of once per sequence. With the k1 "
        "estimator both give the same total reward per completion. Default False.",
    )
    logging_steps: float = option(
        1,
        "Log the metrics every this many updates. Default 1: every update, as TRL 0.x's RLOO does "
        "(TrainingArguments' own default is 500).",
    )
    num_mini_batches: int = option(1, "Mini-batches each batch of rollouts is split into.")
    total_episodes: int | None = option(
        None, "Completions to train on in total. Default: num_train_epochs * len(train_dataset)."
    )
    local_rollout_forward_batch_size: int = option(
        64, "Sequences per generation / scoring forward pass (bounds rollout memory)."
    )
    num_sample_generations: int = option(
        10, "How many times during training to print and save sample completions (0: never)."
    )
    num_sample_prompts: int = option(4, "Evaluation prompts shown in each sample-completion table.")
    response_length: int = option(53, "Maximum number of generated tokens per completion.")
    stop_token: Literal["eos"] | None = option(
        None, "'eos': cut completions after the tokenizer's eos token. Default None."
    )
    stop_token_id: int | None = option(
        None, "Token id after which completions are cut (overrides stop_token)."
    )
    temperature: float = option(0.7, "Sampling temperature (also applied to logprobs).")
    missing_eos_penalty: float | None = option(
        None, "Subtracted from the score of each completion that never emits the eos token."
    )
    reward_weights: list[float] | None = option(
        None, "One weight per reward function when several are given; the score is their weighted sum."
    )

    # derived in compute_batch_sizes; listed as fields so they are saved with the config
    world_size: int | None = option(None, "Derived: number of processes.")
    num_total_batches: int | None = option(None, "Derived: number of updates.")
    micro_batch_size: int | None = option(None, "Derived: per_device_train_batch_size * world_size.")
    local_batch_size: int | None = option(
        None, "Derived: completions per process per update (per_device * accumulation * mini-batches)."
    )
    batch_size: int | None = option(None, "Derived: completions per update, all processes.")
    local_mini_batch_size: int | None = option(None, "Derived: local_batch_size / num_mini_batches.")
    mini_batch_size: int | None = option(None, "Derived: batch_size / num_mini_batches.")

    def __post_init__(self):
        super().__post_init__()
        # TrainingArguments exposes world_size as a property; the RLOO field shadows it, so fill it in here
        self.world_size = TrainingArguments.world_size.fget(self)
        self.compute_batch_sizes()

    def validate(self) -> None:
        positive = {
            "num_ppo_epochs": self.num_ppo_epochs,
            "num_mini_batches": self.num_mini_batches,
            "local_rollout_forward_batch_size": self.local_rollout_forward_batch_size,
            "response_length": self.response_length,
            "num_sample_prompts": self.num_sample_prompts,
            "max_consecutive_nonfinite_steps": self.max_consecutive_nonfinite_steps,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.rloo_k < 2:
            raise ValueError(
                f"rloo_k must be >= 2 (the baseline averages the other k-1 completions), got {self.rloo_k}"
            )
        for name in ("cliprange", "temperature", "reward_clip_range"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.num_sample_generations < 0:
            raise ValueError(f"num_sample_generations must be >= 0, got {self.num_sample_generations}")
        if self.stop_token not in (None, "eos"):
            raise ValueError(f"stop_token must be 'eos' or None, got {self.stop_token!r}")
        if self.total_episodes is not None and self.total_episodes < 1:
            raise ValueError(f"total_episodes must be a positive integer or None, got {self.total_episodes}")
        if self.reward_weights is not None and (
            len(self.reward_weights) == 0 or not all(math.isfinite(w) for w in self.reward_weights)
        ):
            raise ValueError(
                f"reward_weights must be a non-empty list of finite numbers, got {self.reward_weights}"
            )

    def compute_batch_sizes(self, train_dataset_size: int | None = None) -> None:
        """Fill in every derived size; errors name the arguments to change.

        The number of updates needs total_episodes, or the dataset size to default it from num_train_epochs.
        """
        self.world_size = self.world_size or 1
        self.local_batch_size = (
            self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches
        )
        self.micro_batch_size = self.per_device_train_batch_size * self.world_size
        self.batch_size = self.local_batch_size * self.world_size
        self.mini_batch_size = exact_div(
            self.batch_size,
            self.num_mini_batches,
            "batch_size = per_device_train_batch_size * "
            "gradient_accumulation_steps * num_mini_batches * world_size, by num_mini_batches",
        )
        self.local_mini_batch_size = exact_div(
            self.local_batch_size, self.num_mini_batches, "local_batch_size"
        )
        exact_div(
            self.local_batch_size,
            self.rloo_k,
            "per_device_train_batch_size * gradient_accumulation_steps * "
            "num_mini_batches must be a multiple of rloo_k, the completions sampled per prompt",
        )
        if self.total_episodes is None and train_dataset_size is not None:
            self.total_episodes = max(1, int(self.num_train_epochs * train_dataset_size))
        if self.total_episodes is not None:
            self.num_total_batches = math.ceil(self.total_episodes / self.batch_size)
            if self.max_steps > 0:  # an explicit max_steps caps the number of updates
                self.num_total_batches = min(self.num_total_batches, self.max_steps)

    @property
    def local_prompt_batch_size(self) -> int:
        """Prompts per process per update: each is sampled rloo_k times."""
        return self.local_batch_size // self.rloo_k

    @property
    def sample_generations_freq(self) -> int:
        """Updates between two sample-completion tables."""
        if not self.num_sample_generations or not self.num_total_batches:
            return 0
        return max(1, self.num_total_batches // self.num_sample_generations)
