"""The fields of trainers that sample a group of completions per prompt (GRPO, RLOO in TRL 1.x's form).

Sizes count completions. One update (one optimizer step, one `global_step`) trains on
`per_device_train_batch_size * gradient_accumulation_steps` completions per process. One generation batch
holds `per_device_train_batch_size * steps_per_generation` completions per process (`generation_batch_size`
across processes): `num_generations` of each of its prompts, the group of a prompt on consecutive rows. It is
trained on for `steps_per_generation / gradient_accumulation_steps` updates, `num_iterations` times over.
Each config declares its own `num_generations`, `temperature` and `beta`, whose defaults differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhfkit.trainers.common.config import (
    ChatTemplatePath,
    SyncRefModel,
    check_positive_integers,
    exact_div,
    option,
    pad_multiple,
)

REFERENCE_DTYPES = (None, "bfloat16", "float16", "float32")


@dataclass
class GroupRollouts(ChatTemplatePath, SyncRefModel):
    """Sampling, sizes, clipping and logging shared by the group trainers; checked by `check_groups`."""

    max_prompt_length: int | None = option(
        512, "Prompts longer than this many tokens keep their last ones (None: no limit)."
    )
    max_completion_length: int = option(512, "Maximum number of generated tokens.")
    generation_batch_size: int | None = option(
        None,
        "Completions per generation, all processes. Default: per_device_train_batch_size * processes "
        "* steps_per_generation. Give this or steps_per_generation, not both.",
    )
    steps_per_generation: int | None = option(
        None, "Micro-batches per generation (default: gradient_accumulation_steps)."
    )
    top_p: float = option(1.0, "Nucleus sampling: keep the top tokens up to this mass.")
    top_k: int = option(0, "Sample among the k most likely tokens (0: all).")
    min_p: float | None = option(None, "Drop tokens below min_p times the top token's probability.")
    repetition_penalty: float = option(1.0, "Penalise tokens seen in prompt or completion; >1 repeats less.")
    generation_kwargs: dict | None = option(
        None, "Further transformers GenerationConfig settings; they win over the above."
    )
    cache_implementation: str | None = option(
        None,
        "transformers KV-cache implementation for sampling (e.g. 'static'); rlhfkit's decode loop then hands "
        "sampling to model.generate, which honours it.",
    )
    pad_to_multiple_of: int | str | None = option(
        "auto",
        "Pad prompts (left) and completions (right) to a multiple of this many tokens: fixed shapes for "
        "compilers. 'auto': none (TRL pads to 128 on AWS Neuron, which rlhfkit does not run on).",
    )
    num_iterations: int = option(1, "Passes over each generation batch (mu in the GRPO paper).")
    epsilon: float = option(0.2, "Lower clipping range of the ratio (and upper by default).")
    epsilon_high: float | None = option(None, "Upper clipping range (DAPO's clip-higher); default: epsilon.")
    mask_truncated_completions: bool = option(
        False, "Leave completions that hit max_completion_length out of the loss (DAPO)."
    )
    reward_weights: list[float] | None = option(None, "One weight per reward function (default: all 1).")
    ref_model_dtype: str | None = option(
        None,
        "rlhfkit only: hold the frozen reference copy in this dtype ('bfloat16' or 'float16'; None: the "
        "policy's). Halves a float32 reference's memory; its logprobs then come from rounded weights.",
    )
    num_generations_eval: int | None = option(
        None, "Completions per prompt in evaluate() (default: num_generations)."
    )
    chat_template_kwargs: dict | None = option(
        None, "Extra keywords for the chat template of chat prompts, e.g. {'enable_thinking': False}."
    )
    shuffle_dataset: bool = option(True, "Draw the prompts in a new order each epoch (False: in order).")
    log_completions: bool = option(
        False, "Print a table of sampled completions and rewards every logging step."
    )
    num_completions_to_print: int | None = option(None, "Rows of that table (None: all).")
    log_unique_prompts: bool = option(False, "That table shows one completion per prompt.")
    disable_dropout: bool = option(
        True,
        "Dropout off in the policy: sampling and training then score a completion alike. TRL defaults to "
        "False; rlhfkit to True.",
    )
    max_tool_calling_iterations: int | None = option(
        None,
        "With tools or environments: the most times one completion's tool calls are run and the model "
        "sampled again (None: no cap; the episode ends without a call or at max_completion_length).",
    )
    tool_timeout: float = option(
        30.0,
        "rlhfkit only: seconds one tool call may run; a call that takes longer answers the model with an "
        "error and the episode goes on.",
    )

    def check_groups(self) -> None:
        """ValueError naming the field for a bad group setting (`compute_group_sizes` fills in the sizes)."""
        self.pad_to_multiple_of = pad_multiple(self.pad_to_multiple_of)
        check_positive_integers(
            self,
            ("num_generations", "max_completion_length", "num_iterations"),
            optional=(
                "max_prompt_length",
                "steps_per_generation",
                "generation_batch_size",
                "num_completions_to_print",
                "num_generations_eval",
            ),
        )
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (advantages compare the completions of one prompt), "
                f"got {self.num_generations}"
            )
        checks = {
            "temperature": (self.temperature, lambda v: v is None or v > 0, "> 0"),
            "top_p": (self.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
            "top_k": (self.top_k, lambda v: v >= 0, ">= 0 (0: off)"),
            "min_p": (self.min_p, lambda v: v is None or 0 <= v <= 1, "in [0, 1] or None"),
            "repetition_penalty": (self.repetition_penalty, lambda v: v > 0, "> 0"),
            "beta": (self.beta, lambda v: v >= 0, ">= 0"),
            "epsilon": (self.epsilon, lambda v: v > 0, "> 0"),
            "epsilon_high": (self.epsilon_high, lambda v: v is None or v > 0, "> 0 or None"),
            "tool_timeout": (self.tool_timeout, lambda v: v > 0, "> 0 (seconds)"),
            "max_tool_calling_iterations": (
                self.max_tool_calling_iterations,
                lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                "an integer >= 0 or None (0: tools are never run)",
            ),
        }
        for name, (value, ok, expected) in checks.items():
            if not ok(value):
                raise ValueError(f"{name} must be {expected}, got {value!r}")
        self.check_sync_ref_model()
        if self.steps_per_generation is not None and self.generation_batch_size is not None:
            raise ValueError("give generation_batch_size or steps_per_generation, not both")
        if self.reward_weights is not None and (
            len(self.reward_weights) == 0 or not all(math.isfinite(w) for w in self.reward_weights)
        ):
            raise ValueError(
                f"reward_weights must be a non-empty list of finite numbers, got {self.reward_weights}"
            )
        if self.ref_model_dtype not in REFERENCE_DTYPES:
            raise ValueError(
                f"ref_model_dtype must be one of {', '.join(map(str, REFERENCE_DTYPES))}, "
                f"got {self.ref_model_dtype!r}"
            )
        if self.sync_ref_model and self.beta == 0:
            raise ValueError("sync_ref_model needs beta > 0: with beta=0 there is no reference model to sync")

    def compute_group_sizes(self) -> None:
        """Fill in steps_per_generation / generation_batch_size and check that every division is exact."""
        per_step = self.per_device_train_batch_size * self.world_size
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        elif self.steps_per_generation is None:
            self.steps_per_generation = exact_div(
                self.generation_batch_size,
                per_step,
                "generation_batch_size by per_device_train_batch_size * number of processes",
            )
        self.generation_batch_size = per_step * self.steps_per_generation
        exact_div(
            self.steps_per_generation,
            self.gradient_accumulation_steps,
            "steps_per_generation must be a multiple of gradient_accumulation_steps",
        )
        exact_div(
            self.local_generation_batch_size,
            self.num_generations,
            "per_device_train_batch_size * steps_per_generation (one process's completions per generation) "
            "must be a multiple of num_generations",
        )

    @property
    def local_generation_batch_size(self) -> int:
        """Completions one process samples per generation."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def local_prompts_per_generation(self) -> int:
        return self.local_generation_batch_size // self.num_generations

    @property
    def updates_per_generation(self) -> int:
        """Optimizer steps one generation batch is split into (each pass over it)."""
        return self.steps_per_generation // self.gradient_accumulation_steps
