"""`RLOOTrainer`: one public name for TRL's two RLOO trainers, told apart by the arguments they are given.

- The classic form of TRL 0.x: `RLOOTrainer(config, processing_class, policy, ref_policy, reward_model,
  train_dataset, ...)` (`tokenizer=` also accepted), a PPO-style loop over a loaded policy and reward model
  (`trainers.rloo.trainer.ClassicRLOOTrainer`).
- The current form of TRL 1.x: `RLOOTrainer(model, reward_funcs, args=RLOOConfig(...), train_dataset,
  processing_class, ...)`, shaped like GRPOTrainer (`trainers.rloo.current.GroupRLOOTrainer`).
Both are subclasses of `RLOOTrainer`, so `isinstance(trainer, RLOOTrainer)` holds for either.
"""

from __future__ import annotations

from typing import Any

# keywords only one form takes; positionally, the current form starts with its model (a module or a path)
CLASSIC_KEYWORDS = frozenset(
    {
        "config",
        "policy",
        "ref_policy",
        "reward_model",
        "tokenizer",
        "reward_processing_class",
        "data_collator",
    }
)
CURRENT_KEYWORDS = frozenset(
    {
        "model",
        "reward_funcs",
        "args",
        "peft_config",
        "reward_processing_classes",
        "tools",
        "rollout_func",
        "environment_factory",
    }
)


def trainer_form(args: tuple, kwargs: dict[str, Any]) -> str:
    """'classic' or 'current', from the arguments given to `RLOOTrainer(...)`; mixing them is an error."""
    from torch import nn

    classic, current = sorted(CLASSIC_KEYWORDS & kwargs.keys()), sorted(CURRENT_KEYWORDS & kwargs.keys())
    if args:
        model_first = isinstance(args[0], (nn.Module, str))
        (current if model_first else classic).insert(0, "a first positional argument")
    if classic and current:
        raise TypeError(
            f"RLOOTrainer got {classic[0]} (the classic form: config, policy, ref_policy, reward_model) and "
            f"{current[0]} (the current form: model, reward_funcs, args); use the arguments of one form"
        )
    if not classic and not current:
        raise TypeError(
            "RLOOTrainer needs either model= and reward_funcs= (TRL 1.x's form) or config=, policy=, "
            "ref_policy= and reward_model= (TRL 0.x's form)"
        )
    return "classic" if classic else "current"


class RLOOTrainer:
    """REINFORCE leave-one-out (Ahmadian et al. 2024) in TRL's classic or current form; see the module."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is RLOOTrainer:
            if trainer_form(args, kwargs) == "classic":
                from rlhfkit.trainers.rloo.trainer import ClassicRLOOTrainer as cls
            else:
                from rlhfkit.trainers.rloo.current import GroupRLOOTrainer as cls
        return super().__new__(cls)
