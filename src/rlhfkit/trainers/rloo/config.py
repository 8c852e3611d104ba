"""RLOOConfig: TrainingArguments plus the REINFORCE leave-one-out options of both of TRL's forms.

`RLOOTrainer` comes in two forms (`trainers.rloo.forms`), and one config serves both:
- the classic form of TRL 0.x (`rloo_k`, `kl_coef`, `cliprange`, `num_ppo_epochs`, `response_length`, ...);
- the current form of TRL 1.x, shaped like GRPO (`num_generations`, `beta`, `epsilon`, `num_iterations`,
  `max_completion_length`, `normalize_advantages`, ...: the `GroupRollouts` fields).
Setting a field that only one form reads picks that form (`form`); fields of both is an error. Three shared
fields have a default per form, applied by the trainer (`settle`): `temperature` (0.7 classic, 1.0
current), `learning_rate` (TrainingArguments' 5e-5 classic, TRL 1.x's 1e-6 current) and `logging_steps`
(1 classic, 10 current). `reward_clip_range` is a number c (the classic form clips its normalised scores
to [-c, c], 10 by default) or a (min, max) pair (the current form clips the raw rewards; a number c means
(-c, c)).

In the classic form an "episode" is one completion. One update (one optimizer-scheduler step, one
`global_step`) consumes `batch_size` episodes: `batch_size / rloo_k` prompts per update across all
processes, each sampled `rloo_k` times. All derived sizes are computed in `compute_batch_sizes`, nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Literal

from transformers import TrainingArguments

from rlhfkit.trainers.common.config import (
    DatasetNumProc,
    GenerationOptions,
    HealthChecks,
    HFTrainerConfig,
    ModelInitKwargs,
    RouterAuxLossCoef,
    exact_div,
    option,
)
from rlhfkit.trainers.common.group_config import GroupRollouts

FORMS = ("classic", "current")
TEMPERATURE = {"classic": 0.7, "current": 1.0}
LEARNING_RATE = {"classic": 5e-5, "current": 1e-6}
LOGGING_STEPS = {"classic": 1, "current": 10}
CLASSIC_CLIP = 10.0  # the classic form's clip of normalised scores when reward_clip_range is not given
CLASSIC_FIELDS = (
    "exp_name", "reward_model_path", "sft_model_path", "num_ppo_epochs", "whiten_rewards", "kl_coef",
    "cliprange", "rloo_k", "normalize_reward", "normalize_advantage", "token_level_kl", "num_mini_batches",
    "total_episodes", "local_rollout_forward_batch_size", "num_sample_generations", "num_sample_prompts",
    "response_length", "stop_token", "stop_token_id", "missing_eos_penalty",
)  # fmt: skip
CURRENT_FIELDS = (
    *(f.name for f in fields(GroupRollouts) if f.name != "reward_weights"),
    "num_generations", "beta", "normalize_advantages", "model_init_kwargs", "router_aux_loss_coef",
)  # fmt: skip
FORM_FIELDS = {"classic": CLASSIC_FIELDS, "current": CURRENT_FIELDS}


@dataclass
class RLOOConfig(
    RouterAuxLossCoef,
    GroupRollouts,
    DatasetNumProc,
    GenerationOptions,
    HealthChecks,
    ModelInitKwargs,
    HFTrainerConfig,
):
    """Configuration for `RLOOTrainer` in either form; every `transformers.TrainingArguments` field also
    applies."""

    learning_rate: float | None = option(
        None, "Initial AdamW learning rate. Default: 5e-5 in the classic form, 1e-6 in the current form."
    )
    temperature: float | None = option(
        None, "Sampling temperature (also applied to logprobs). Default: 0.7 classic, 1.0 current."
    )
    reward_clip_range: list[float] | None = option(
        None,
        "Classic form: c, the clip of the normalised scores (normalize_reward; default 10). Current form: "
        "(min, max), the clip of the raw rewards (one number c: (-c, c)); default None, no clipping.",
    )
    # ---------------------------------------------------------------- the current form (TRL 1.x)
    num_generations: int = option(2, "Current form: completions sampled per prompt (>= 2).")
    beta: float = option(
        0.05,
        "Current form: KL coefficient; the summed k1 KL is subtracted from each reward (0: no reference).",
    )
    normalize_advantages: bool = option(
        False, "Current form: standardise the advantages of a generation batch to mean 0, std 1."
    )
    # ---------------------------------------------------------------- the classic form (TRL 0.x)

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
    normalize_advantage: bool = option(
        False, "Reinforce++: standardise the advantages of a batch to mean 0, std 1."
    )
    token_level_kl: bool = option(
        False,
        "Apply the KL penalty per token (Reinforce++ eq. 1) instead of once per sequence. With the k1 "
        "estimator both give the same total reward per completion. Default False.",
    )
    logging_steps: float | None = option(
        None,
        "Log the metrics every this many updates. Default: 1 in the classic form (every update, as TRL 0.x's "
        "RLOO; TrainingArguments says 500), 10 in the current form (TRL 1.x's).",
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
    missing_eos_penalty: float | None = option(
        None, "Subtracted from the score of each completion that never emits the eos token."
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
        self._form = self.form_of_fields()  # before any size is derived
        self._settled = False
        per_form = {name: getattr(self, name) is None for name in ("logging_steps", "eval_steps")}
        if per_form["logging_steps"]:  # chosen by `settle`; TrainingArguments checks a number meanwhile
            self.logging_steps = LOGGING_STEPS["classic"]
        super().__post_init__()
        if per_form["logging_steps"]:
            self.logging_steps = None
            if per_form["eval_steps"]:  # TrainingArguments copied the stand-in into eval_steps
                self.eval_steps = None
        # TrainingArguments exposes world_size as a property; the RLOO field shadows it, so fill it in here
        self.world_size = TrainingArguments.world_size.fget(self)
        if self._form == "current":
            self.settle("current")
        else:
            self.compute_batch_sizes()

    def form_of_fields(self) -> str | None:
        """The form the fields set away from their defaults belong to (None: only shared fields are set)."""
        changed = {
            f.name for f in fields(self) if f.default is not MISSING and getattr(self, f.name) != f.default
        }
        found = {form: sorted(changed & set(FORM_FIELDS[form])) for form in FORMS}
        if found["classic"] and found["current"]:
            raise ValueError(
                f"RLOOConfig: {found['classic'][0]} belongs to the classic form (TRL 0.x) and "
                f"{found['current'][0]} to the current form (TRL 1.x); set the fields of one form only"
            )
        return next((form for form in FORMS if found[form]), None)

    @property
    def form(self) -> str | None:
        """'classic', 'current', or None while no field of either form is set and no trainer settled it."""
        return self._form

    def settle(self, form: str) -> None:
        """Fix the form (the trainer's), fill in its defaults and check its fields; an error names a field of
        the other form."""
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        if self._form not in (None, form):
            field_name = next(
                f.name for f in fields(self) if f.name in FORM_FIELDS[self._form] and
                getattr(self, f.name) != f.default
            )  # fmt: skip
            raise ValueError(
                f"RLOOTrainer was given its {form} form's arguments, but the config sets {field_name}, a "
                f"field of the {self._form} form; see docs/rloo_trainer.md for the two forms"
            )
        self._form = form
        if self._settled:
            return
        self._settled = True
        if self.temperature is None:
            self.temperature = TEMPERATURE[form]
        if self.learning_rate is None:
            self.learning_rate = LEARNING_RATE[form]
        if self.logging_steps is None:
            self.logging_steps = LOGGING_STEPS[form]
            if self.eval_steps is None and self.eval_strategy == "steps":
                self.eval_steps = self.logging_steps  # TrainingArguments' fallback, with the form's value
        if form == "classic":
            self._check_classic_clip_range()
        else:
            self.check_groups()
            if (
                self.reward_clip_bounds is not None
                and self.reward_clip_bounds[0] >= self.reward_clip_bounds[1]
            ):
                raise ValueError(
                    f"reward_clip_range must be (min, max) with min < max, got {self.reward_clip_range}"
                )
            self.compute_group_sizes()

    @property
    def reward_clip_bounds(self) -> tuple[float, float] | None:
        """`reward_clip_range` as (min, max); None when not given."""
        value = self.reward_clip_range
        if value is None:
            return None
        if isinstance(value, (int, float)):
            return (-float(value), float(value))
        if len(value) == 1:
            return (-float(value[0]), float(value[0]))
        return (float(value[0]), float(value[1]))

    def validate(self) -> None:
        self.check_vllm()
        if self._form == "current":
            return  # `settle` checks the current form's fields
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
        if not self.cliprange > 0:
            raise ValueError(f"cliprange must be > 0, got {self.cliprange}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self._form == "classic":
            self._check_classic_clip_range()
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

    def _check_classic_clip_range(self) -> None:
        value = self.reward_clip_range
        number = (
            value if isinstance(value, (int, float)) else (value[0] if value and len(value) == 1 else None)
        )
        if value is not None and (number is None or not number > 0):
            raise ValueError(
                f"reward_clip_range must be one number c > 0 in the classic form (normalised scores are "
                f"clipped to [-c, c]), got {value!r}"
            )

    @property
    def classic_clip_range(self) -> float:
        """The classic form's clip of normalised scores."""
        return CLASSIC_CLIP if self.reward_clip_range is None else self.reward_clip_bounds[1]

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
