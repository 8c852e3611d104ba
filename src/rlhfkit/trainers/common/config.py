"""How rlhfkit configs declare and check their fields, written once for every trainer.

`option(default, help)` is a dataclass field carrying the help text of its `HfArgumentParser` flag. The
mixins hold fields that several configs mean the same way, with one default: a config lists the mixin
among its bases instead of declaring the fields again. `HFTrainerConfig` is the base of the
TrainingArguments-based configs (reward, SFT, DPO, RLOO, GRPO): the non-finite-step budget and the
`__post_init__` order each follows (field types, then TrainingArguments, then the config's own
`validate`, which the trainers run again after keyword overrides).

The checks turn a bad value into an error naming the field before a model is loaded: dataclasses and
TrainingArguments accept any value.
"""

from __future__ import annotations

import re
import types
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from transformers import TrainingArguments

from rlhfkit.trainers.common.legacy_training_args import LegacyTrainingArguments


def option(default: Any = MISSING, help: str = "", **field_kwargs: Any) -> Any:
    """`dataclasses.field(default=default, metadata={"help": help})`; `default_factory=` etc. pass through."""
    return field(default=default, metadata={"help": help}, **field_kwargs)


@dataclass
class NonfiniteStepLimit:
    """The tolerance of every trainer for NaN/inf steps (`rlhfkit.trainers.common.guards.NonFiniteGuard`)."""

    max_consecutive_nonfinite_steps: int = option(
        3,
        "A step (a DDPO epoch) with a NaN/inf loss or score, or an optimizer step with NaN/inf gradients, is "
        "skipped; after this many in a row the run saves its last good state and stops with an error.",
    )


VLLM_MODES = ("server", "colocate")
VLLM_MODEL_IMPLS = ("vllm", "transformers")


@dataclass
class VLLMOptions:
    """TRL 1.x's fields that sample on a vLLM engine instead of in-process (docs/vllm.md). "server": a
    `rlhfkit vllm-serve` server over HTTP; "colocate": an engine inside the training process. Fields whose
    feature rlhfkit lacks are refused (`check_vllm`) unless left at their default."""

    use_vllm: bool = option(
        False, "Sample completions on a vLLM engine (vllm_mode) instead of generation_backend."
    )
    vllm_mode: str = option(
        "colocate",
        "'server': a separate `rlhfkit vllm-serve` process, reached over HTTP; 'colocate': an engine inside "
        "this process, sharing its device (needs vLLM installed here).",
    )
    vllm_server_base_url: str | None = option(
        None, "Server mode: the server's URL, e.g. 'http://localhost:8000' (then host and port are unused)."
    )
    vllm_server_host: str = option("0.0.0.0", "Server mode: the server's host, when no base URL is given.")
    vllm_server_port: int = option(8000, "Server mode: the server's port, when no base URL is given.")
    vllm_server_timeout: float = option(
        240.0, "Server mode: seconds to wait for the server to answer before training; then an error."
    )
    vllm_group_port: int = option(
        51216,
        "TRL's port of the NCCL weight-transfer group. rlhfkit sends weights over HTTP or in memory (no "
        "NCCL group, so CPU works): only the default is accepted.",
    )
    vllm_gpu_memory_utilization: float = option(
        0.3, "Colocate mode: share of the device memory the engine may take (server: a vllm-serve flag)."
    )
    vllm_tensor_parallel_size: int = option(
        1, "Colocate mode: devices the engine splits the model over (server: a vllm-serve flag)."
    )
    vllm_max_model_length: int | None = option(
        None, "Colocate mode: the engine's context window (None: the model config's)."
    )
    vllm_enable_sleep_mode: bool = option(
        False, "Colocate mode: the engine frees its memory while the trainer takes its optimizer steps."
    )
    vllm_model_impl: str = option(
        "vllm", "Colocate mode: the engine's model code, 'vllm' (its own) or 'transformers'."
    )
    vllm_structured_outputs_regex: str | None = option(
        None,
        "Constrain every completion to this regular expression (vLLM's structured outputs; None: no "
        "constraint). Needs use_vllm.",
    )

    def check_vllm(self) -> None:
        """ValueError naming the field: an unknown mode or model implementation, a bad size, or a setting
        of a feature rlhfkit does not offer."""
        if self.vllm_mode not in VLLM_MODES:
            raise ValueError(f"vllm_mode must be one of {', '.join(VLLM_MODES)}; got {self.vllm_mode!r}")
        if self.vllm_model_impl not in VLLM_MODEL_IMPLS:
            raise ValueError(
                f"vllm_model_impl must be one of {', '.join(VLLM_MODEL_IMPLS)}; got {self.vllm_model_impl!r}"
            )
        check_positive_integers(
            self, ("vllm_server_port", "vllm_tensor_parallel_size"), optional=("vllm_max_model_length",)
        )
        check_positive_numbers(self, ("vllm_server_timeout",))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization!r}"
            )
        check_regex(self.vllm_structured_outputs_regex, bool(self.use_vllm))
        if self.vllm_group_port != 51216:
            raise ValueError(
                f"vllm_group_port={self.vllm_group_port} has no effect in rlhfkit: it is the port of TRL's "
                "NCCL weight-transfer group, and rlhfkit sends the weights over HTTP (server) or in memory "
                "(colocate) instead, which works on CPU too, where there is no NCCL group; leave it at 51216"
            )

    def generation_engine(self) -> tuple[str, dict[str, Any]]:
        """(key of `GENERATION_BACKENDS`, the keyword options of its constructor) this config samples
        with: the one place the vLLM fields turn into a backend."""
        if not self.use_vllm:
            return self.generation_backend, {}
        regex = self.vllm_structured_outputs_regex
        constrained = {} if regex is None else {"structured_outputs_regex": regex}
        if self.vllm_mode == "server":
            url = self.vllm_server_base_url or f"http://{self.vllm_server_host}:{self.vllm_server_port}"
            return "vllm-server", {"base_url": url, "timeout": self.vllm_server_timeout, **constrained}
        # the colocated backend refuses what it cannot do (tensor parallelism, sleep mode on CPU) itself
        return "vllm-colocate", {
            "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
            "tensor_parallel_size": self.vllm_tensor_parallel_size,
            "max_model_length": self.vllm_max_model_length,
            "enable_sleep_mode": self.vllm_enable_sleep_mode,
            "model_impl": self.vllm_model_impl,
            **constrained,
        }


def check_regex(regex: str | None, use_vllm: bool) -> None:
    """ValueError naming vllm_structured_outputs_regex: not a string, not a regular expression, or given
    without an engine (only vLLM constrains completions; the in-process samplers would ignore it)."""
    if regex is None:
        return
    if not isinstance(regex, str) or not regex:
        raise ValueError(f"vllm_structured_outputs_regex must be a non-empty string or None, got {regex!r}")
    try:
        re.compile(regex)
    except re.error as err:
        raise ValueError(
            f"vllm_structured_outputs_regex={regex!r} is not a regular expression: {err}"
        ) from err
    if not use_vllm:
        raise ValueError(
            "vllm_structured_outputs_regex constrains a vLLM engine's sampling: set use_vllm=True, or leave "
            "it None (generation_backend cannot constrain completions)"
        )


@dataclass
class GenerationOptions(VLLMOptions):
    """For trainers that sample from the policy while training (`sharding.sharded_generation_context`);
    `generation_engine()` says with what."""

    ds3_gather_for_generation: bool = option(
        True,
        "DeepSpeed ZeRO-3 only: gather the policy weights once for generation (faster); False lets a policy "
        "larger than one GPU train, generating more slowly.",
    )
    generation_backend: Literal["rlhfkit", "transformers"] = option(
        "rlhfkit",
        "What samples completions: 'rlhfkit' (its own decode loop: same distribution, faster) or "
        "'transformers' (model.generate).",
    )


@dataclass
class AccelerateTracking:
    """For trainers that build their own `accelerate.Accelerator` and trackers (PPO, DDPO)."""

    log_with: str | None = option(
        None, "Tracker to log to: 'tensorboard', 'wandb', 'all' or None (no tracker)."
    )
    tracker_kwargs: dict[str, Any] = option(
        help="Keyword arguments for the tracker's init (e.g. wandb run name).", default_factory=dict
    )
    accelerator_kwargs: dict[str, Any] = option(
        help="Keyword arguments for accelerate.Accelerator.", default_factory=dict
    )
    project_kwargs: dict[str, Any] = option(
        help="Keyword arguments for accelerate's ProjectConfiguration (e.g. logging_dir).",
        default_factory=dict,
    )
    tracker_project_name: str = option("trl", "Project name the trackers log under.")


@dataclass
class HealthChecks:
    """For the RL trainers that watch their own metrics (`rlhfkit.trainers.common.health`, docs/health.md)."""

    health_checks: bool = option(
        True,
        "Watch the training metrics for runaway KL, entropy collapse, length exploitation, reward "
        "hacking (with a judge's eval/win_rate), clipping blow-up and sampling/training logprob gaps: "
        "log health/* metrics and warn (HealthWarning) at most once per alarm every 100 steps.",
    )


def exact_div(a: int, b: int, what: str = "") -> int:
    """`a // b`, raising a clear error when `b` does not divide `a` (e.g. batch sizes)."""
    if b <= 0:
        raise ValueError(f"{what or 'divisor'} must be a positive integer, got {b}")
    if a % b != 0:
        detail = f" ({what})" if what else ""
        raise ValueError(f"{a} is not divisible by {b}{detail}; choose sizes where it divides exactly")
    return a // b


def check_positive_integers(
    config: Any, names: tuple[str, ...], optional: tuple[str, ...] = (), prefix: str = ""
) -> None:
    """ValueError naming the first field of `names` (or of `optional`, unless None) that is not an
    integer >= 1; `prefix` (e.g. "--") is written before the name."""
    for name in (*names, *(n for n in optional if getattr(config, n) is not None)):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}{name} must be a positive integer, got {value!r}")


def check_positive_numbers(config: Any, names: tuple[str, ...], prefix: str = "") -> None:
    """ValueError naming the first field of `names` that is not a number > 0 (rates, scales, ranges)."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{prefix}{name} must be > 0, got {value!r}")


def check_field_types(config: Any, skip_fields_of: type | None = None) -> None:
    """Raise a TypeError naming the field when a config value does not match its annotation (int, float,
    str or bool).

    Dataclasses do not check types, so `cliprange="0.2"` would otherwise fail later with an unrelated
    comparison error. Fields declared by `skip_fields_of` (e.g. TrainingArguments, which converts its own
    values) and fields with other annotations are left alone. An int is accepted where a float is expected.
    """
    import dataclasses
    import typing

    skip = {f.name for f in dataclasses.fields(skip_fields_of)} if skip_fields_of is not None else set()
    hints = typing.get_type_hints(type(config))
    simple = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
    for f in dataclasses.fields(config):
        if f.name in skip or f.name not in hints:
            continue
        hint = hints[f.name]
        options = (
            typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        )
        if not all(o in simple or o is type(None) for o in options):
            continue  # lists, Literals, dicts...: the config's own checks handle them
        value = getattr(config, f.name)
        allowed = tuple(t for o in options for t in (simple.get(o) or (type(None),)))
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in options)
        if not ok:
            names = " or ".join("None" if o is type(None) else o.__name__ for o in options)
            raise TypeError(
                f"{type(config).__name__}.{f.name} must be {names}, got {type(value).__name__} {value!r}"
            )


def check_training_sizes(args: Any) -> None:
    """ValueError naming the flag when a TrainingArguments batch size or step count is zero or negative."""
    names = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    for name in (*names, "max_consecutive_nonfinite_steps"):
        value = getattr(args, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class HFTrainerConfig(NonfiniteStepLimit, LegacyTrainingArguments):
    """Base of the Trainer-style configs; a subclass checks its own fields in `validate`."""

    def __post_init__(self):
        check_field_types(self, skip_fields_of=TrainingArguments)
        super().__post_init__()
        self.validate()

    def validate(self) -> None:
        """Check the config's own fields; also called again after a trainer's keyword overrides."""


@dataclass
class ModelInitKwargs:
    """Mixin field for configs whose trainer accepts `model` as a path."""

    model_init_kwargs: dict[str, Any] | None = option(
        None, "Keyword arguments for from_pretrained when `model` is a path string."
    )
    trust_remote_code: bool = option(
        False, "Let from_pretrained run code shipped in a model's folder (models given as paths); off."
    )

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """`model_init_kwargs`, with `trust_remote_code` from its field unless they set it themselves."""
        return {"trust_remote_code": self.trust_remote_code, **(self.model_init_kwargs or {})}


@dataclass
class DatasetNumProc:
    """Mixin field for configs whose trainer tokenises its datasets with `datasets.map`."""

    dataset_num_proc: int | None = option(
        None, "Worker processes for tokenising the datasets (None: this one)."
    )


@dataclass
class TokenizesDatasets(DatasetNumProc):
    """Mixin fields for configs whose trainer turns raw text columns into its own model inputs."""

    remove_unused_columns: bool = option(
        False, "Kept False: the trainer picks the columns it needs; they are not all forward() arguments."
    )


@dataclass
class MaxLength:
    """Mixin field for configs that cut each tokenised sequence at one length."""

    max_length: int | None = option(
        512, "Longest tokenised sequence, prompt included (each side of a pair). None: no limit."
    )


def pad_multiple(value: int | str | None) -> int | None:
    """`pad_to_multiple_of` as an int or None: TRL 1.x's default "auto" (it rounds to 128 only on AWS Neuron)
    and the command line's "none" are None, a number given as text is that number."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none", "null"):
            return None
        if text.isdigit():
            value = int(text)
    if value is not None and (isinstance(value, (bool, str)) or not isinstance(value, int) or value < 1):
        raise ValueError(f"pad_to_multiple_of must be a positive integer, 'auto' or None, got {value!r}")
    return value


@dataclass
class PadToMultipleOf:
    """Mixin field for configs whose collator can round the padded width up (TRL 1.x's field)."""

    pad_to_multiple_of: int | str | None = option(
        None,
        "Pad each batch to a multiple of this many tokens (None: to its longest row). TRL 1.x's 'auto' means "
        "None here: it rounds to 128 only on AWS Neuron devices.",
    )

    def __post_init__(self):
        self.pad_to_multiple_of = pad_multiple(self.pad_to_multiple_of)
        super().__post_init__()


@dataclass
class RouterAuxLossCoef:
    """Mixin field for configs whose trainer can train a mixture-of-experts policy (TRL 1.x's field);
    `rlhfkit.trainers.common.moe` resolves and applies it."""

    router_aux_loss_coef: float | None = option(
        None,
        "Weight of a mixture-of-experts model's load-balancing loss, added to the training loss and logged "
        "as aux_loss. None: the model config's own router_aux_loss_coef; 0: off. An error for a model "
        "without routers.",
    )

    def __post_init__(self):
        coef = self.router_aux_loss_coef
        is_number = isinstance(coef, int | float) and not isinstance(coef, bool)
        if coef is not None and not (is_number and coef >= 0):
            raise ValueError(f"router_aux_loss_coef must be a number >= 0 or None, got {coef!r}")
        super().__post_init__()


@dataclass
class ChatTemplatePath:
    """Mixin field for configs that render chats: a template to use instead of the tokenizer's."""

    chat_template_path: str | None = option(
        None,
        "A Jinja file (.jinja/.j2), or a tokenizer folder or a model name in the local hub cache, whose chat "
        "template replaces the tokenizer's.",
    )


@dataclass
class SyncRefModel:
    """Mixin fields of TR-DPO's reference syncing (Gorbatovski et al. 2024), for every trainer whose
    reference is a frozen copy of the policy (DPO, KTO, GRPO, RLOO's current form)."""

    sync_ref_model: bool = option(
        False,
        "Mix the reference toward the policy every ref_model_sync_steps (TR-DPO, Gorbatovski et al. 2024).",
    )
    ref_model_mixup_alpha: float = option(0.6, "ref = alpha * policy + (1 - alpha) * ref at each sync.")
    ref_model_sync_steps: int = option(512, "Optimizer steps between two reference syncs.")

    def check_sync_ref_model(self) -> None:
        """ValueError naming the field for a mixing weight outside [0, 1] or a sync period below 1."""
        if not 0.0 <= self.ref_model_mixup_alpha <= 1.0:
            raise ValueError(f"ref_model_mixup_alpha must be in [0, 1], got {self.ref_model_mixup_alpha}")
        steps = self.ref_model_sync_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"ref_model_sync_steps must be >= 1 (an integer), got {steps!r}")
