"""Pure tensor maths for RLHF: no trainer state, no I/O. Needs only torch."""

from rlhfkit.core.advantages import compute_gae, rloo_advantages
from rlhfkit.core.kl import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty
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
from rlhfkit.core.rewards import (
    RunningMoments,
    apply_missing_eos_penalty,
    batch_moments,
    clip_tensor,
    combine_moments,
    compute_token_rewards,
    scale_scores,
)

__all__ = [
    "DPO_LOSSES",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "PolicyLossOutput",
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
    "first_true_indices",
    "full_kl_from_logits",
    "kl_penalty",
    "last_true_indices",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pairwise_reward_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
    "rloo_advantages",
    "scale_scores",
    "selective_log_softmax",
    "truncate_at_stop",
]
