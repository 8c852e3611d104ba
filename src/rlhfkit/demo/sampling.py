"""Sampling completions of prompts from a policy, shared by the preference and evaluation stages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlhfkit.rollout import SamplingParams, make_generation_backend, pad_left


@dataclass
class Completions:
    """Prompts, their sampled completions as tensors, and the decoded completion text (no special tokens)."""

    prompts: list[str]
    query_ids: torch.Tensor  # (B, Lq) left-padded
    query_mask: torch.Tensor  # (B, Lq)
    responses: torch.Tensor  # (B, R) right-padded
    response_mask: torch.Tensor  # (B, R) True = real token (eos included)
    texts: list[str]
    ended: list[bool]  # True where the completion emitted eos

    def reviews(self) -> list[str]:
        """Prompt + completion: the whole review, as the gold judge reads it."""
        return [p + t for p, t in zip(self.prompts, self.texts)]


def encode_prompts(tokenizer, prompts: Sequence[str], device: torch.device | str = "cpu"):
    ids = [
        torch.tensor(tokenizer(p, add_special_tokens=False)["input_ids"], dtype=torch.long) for p in prompts
    ]
    query_ids, query_mask = pad_left(ids, tokenizer.pad_token_id)
    return query_ids.to(device), query_mask.to(device)


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    chunk_size: int = 64,
    greedy: bool = False,
) -> Completions:
    """One sampled completion per prompt (pure sampling at `temperature`), cut after eos.

    `greedy=True` takes the most likely token at each step instead (`temperature` and `seed` unused).
    """
    device = next(model.parameters()).device
    query_ids, query_mask = encode_prompts(tokenizer, prompts, device)
    sampling = dict(temperature=temperature, top_k=0, top_p=1.0) if not greedy else {}
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        **sampling,
        stop_token_ids=None if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,),
    )
    from rich.progress import Progress

    with torch.random.fork_rng(devices=[]), Progress(transient=True) as progress:
        torch.manual_seed(seed)
        task = progress.add_task(f"sampling {len(prompts)} completions", total=len(prompts))
        backend = make_generation_backend(
            model, tokenizer.pad_token_id, chunk_size=chunk_size, progress=lambda n: progress.advance(task, n)
        )
        out = backend.generate(query_ids, query_mask, params)
    responses, response_mask = out.responses, out.response_mask
    eos = tokenizer.eos_token_id
    ended = ((responses == eos) & response_mask).any(1).tolist()
    texts = [tokenizer.decode(r[m], skip_special_tokens=True) for r, m in zip(responses, response_mask)]
    return Completions(list(prompts), query_ids, query_mask, responses, response_mask, texts, ended)
