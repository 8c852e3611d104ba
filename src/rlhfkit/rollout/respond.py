"""`respond_to_batch`: TRL's one-call sampler for a batch of equal-length queries.

A thin front to the trainers' generation backend (`make_generation_backend`), so it samples exactly as
`PPOTrainer.generate` does (eval mode, no gradient). One departure from TRL 0.7, which runs its own
token loop: every response has exactly `txt_len` tokens because the end-of-sequence token is
suppressed until then (otherwise `generate` would stop there), so it is never sampled.
"""

from __future__ import annotations

import torch

from rlhfkit.rollout.backends import make_generation_backend
from rlhfkit.rollout.generation import SamplingParams


def respond_to_batch(
    model: torch.nn.Module, queries: torch.Tensor, txt_len: int = 20, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Sample `txt_len` new tokens after each query.

    Args:
        model: a causal LM, or one with a value head (`AutoModelForCausalLMWithValueHead`).
        queries: (B, Lq) token ids, all real tokens (e.g. `tokenizer.encode(text, return_tensors="pt")`).
        txt_len: number of tokens to sample per query.
        top_k: keep only the k most likely tokens (0: no top-k filtering).
        top_p: nucleus sampling threshold (1.0: no filtering).
    Returns:
        (B, txt_len) sampled token ids, without the query.
    """
    if not isinstance(queries, torch.Tensor) or queries.dim() != 2:
        shape = tuple(queries.shape) if isinstance(queries, torch.Tensor) else type(queries).__name__
        raise ValueError(f"queries must be a (batch, length) tensor of token ids, got {shape}")
    if not isinstance(txt_len, int) or txt_len < 1:
        raise ValueError(f"txt_len must be a positive integer, got {txt_len!r}")
    if int(top_k) < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(
            f"respond_to_batch needs top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}"
        )
    params = SamplingParams(
        max_new_tokens=txt_len,
        do_sample=True,
        top_k=int(top_k),
        top_p=float(top_p),
        temperature=1.0,
        extra={"min_new_tokens": txt_len},
    )
    # no response ends early, so the pad id never appears in the output; any valid id will do
    return (
        make_generation_backend(model, pad_token_id=0)
        .generate(queries, torch.ones_like(queries), params)
        .responses
    )
