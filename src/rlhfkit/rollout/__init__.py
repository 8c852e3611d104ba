"""Generation and scoring of completions, shared by every online trainer."""

from rlhfkit.rollout.backends import (
    GENERATION_BACKENDS,
    GenerationBackend,
    GenerationOutput,
    SamplingParams,
    make_generation_backend,
)
from rlhfkit.rollout.decoding import DecodeLoopBackend
from rlhfkit.rollout.generation import HFGenerationBackend, LengthSampler, eval_mode, pad_left, pad_right
from rlhfkit.rollout.scoring import (
    ForwardOutput,
    forward_response,
    last_true_indices,
    position_ids_from_mask,
    reward_model_scores,
)

__all__ = [
    "GENERATION_BACKENDS",
    "DecodeLoopBackend",
    "ForwardOutput",
    "GenerationBackend",
    "GenerationOutput",
    "HFGenerationBackend",
    "LengthSampler",
    "SamplingParams",
    "eval_mode",
    "forward_response",
    "last_true_indices",
    "make_generation_backend",
    "pad_left",
    "pad_right",
    "position_ids_from_mask",
    "reward_model_scores",
]
