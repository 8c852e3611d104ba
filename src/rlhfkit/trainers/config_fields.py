"""How rlhfkit configs declare a field, and the fields that trainers of several kinds declare alike.

`option(default, help)` is a dataclass field carrying the help text of its `HfArgumentParser` flag. The
mixins hold fields that PPO, DDPO and the Trainer-style configs mean the same way, with one default; a
config lists the mixin among its bases instead of declaring the fields again.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Literal


def option(default: Any = MISSING, help: str = "", **field_kwargs: Any) -> Any:
    """`dataclasses.field(default=default, metadata={"help": help})`; `default_factory=` etc. pass through."""
    return field(default=default, metadata={"help": help}, **field_kwargs)


@dataclass
class NonfiniteStepLimit:
    """The tolerance of every trainer for NaN/inf steps (see `rlhfkit.trainers.guards.NonFiniteGuard`)."""

    max_consecutive_nonfinite_steps: int = option(
        3,
        "A step (a DDPO epoch) with a NaN/inf loss or score, or an optimizer step with NaN/inf gradients, is "
        "skipped; after this many in a row the run saves its last good state and stops with an error.",
    )


@dataclass
class ZeRO3Generation:
    """For trainers that sample from the policy while training (`sharded_generation.zero3_generation_context`)."""

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

    log_with: str | None = option(None, "Tracker to log to: 'tensorboard', 'wandb', 'all' or None (no tracker).")
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
    """For the RL trainers that watch their own metrics (`rlhfkit.trainers.health`, docs/health.md)."""

    health_checks: bool = option(
        True,
        "Watch the training metrics for runaway KL, entropy collapse, length exploitation, reward hacking (with a "
        "judge's eval/win_rate), clipping blow-up and sampling/training logprob gaps: log health/* metrics and warn "
        "(HealthWarning) at most once per alarm every 100 steps.",
    )
