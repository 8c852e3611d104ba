"""Pure tensor maths for RLHF: no trainer state, no I/O. Needs only torch.

Two TRL `trl.core` helpers that need transformers, `respond_to_batch` and `LengthSampler`, are also
importable from here; they load on first use, so `import rlhfkit.core` itself stays torch-only.
"""

import importlib
from typing import Any

from rlhfkit.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_gae,
    group_advantages,
    leave_one_out_advantages,
    rloo_advantages,
    whitened_gae,
)
from rlhfkit.core.entropy import entropy_mask
from rlhfkit.core.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    per_token_kl,
)
from rlhfkit.core.logprobs import entropy_from_logits, full_kl_from_logits, selective_log_softmax
from rlhfkit.core.losses import (
    DPO_LOSSES,
    PolicyLossOutput,
    ValueLossOutput,
    dpo_loss,
    pairwise_reward_loss,
    ppo_policy_loss,
    ppo_value_loss,
)
from rlhfkit.core.masking import (
    first_true_indices,
    last_true_indices,
    masked_mean,
    masked_var,
    masked_whiten,
    truncate_at_stop,
)
from rlhfkit.core.policy_losses import (
    POLICY_LOSSES,
    PolicyLossResult,
    PolicyLossSpec,
    policy_loss,
)
from rlhfkit.core.rewards import (
    RunningMoments,
    apply_missing_eos_penalty,
    batch_moments,
    clip_tensor,
    combine_moments,
    compute_token_rewards,
    scale_scores,
)

# TRL's `trl.core` names that live outside core (they need transformers): loaded on first access
_LAZY = {
    "LengthSampler": "rlhfkit.rollout.generation",
    "respond_to_batch": "rlhfkit.rollout.respond",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'rlhfkit.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


# the lazy names stay out of __all__, so `from rlhfkit.core import *` does not load transformers
__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DPO_LOSSES",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "POLICY_LOSSES",
    "PolicyLossOutput",
    "PolicyLossResult",
    "PolicyLossSpec",
    "RunningMoments",
    "ValueLossOutput",
    "apply_missing_eos_penalty",
    "batch_moments",
    "clip_tensor",
    "combine_moments",
    "compute_gae",
    "compute_token_rewards",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_mask",
    "first_true_indices",
    "full_kl_from_logits",
    "group_advantages",
    "kl_penalty",
    "last_true_indices",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pairwise_reward_loss",
    "per_token_kl",
    "policy_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
    "leave_one_out_advantages",
    "rloo_advantages",
    "whitened_gae",
    "scale_scores",
    "selective_log_softmax",
    "truncate_at_stop",
]
