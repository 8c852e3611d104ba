"""What trainers need from a sampler, and which samplers there are.

`GenerationBackend` is the interface every trainer calls: left-padded prompts in, right-padded
completions (and the logprobs they were sampled with) out. `SamplingParams` holds temperature,
top-k/top-p, lengths and stop tokens in one place, for any backend. `GENERATION_BACKENDS` names the
implementations, which the configs' `generation_backend` field selects: a new backend is a subclass
of `GenerationBackend` in a module of its own plus one line here. The registry names each class by
its import path, so this module imports none of them (they all import it).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import GenerationConfig


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions, in settings any generation backend understands.

    A setting left None keeps the backend's default (for `HFGenerationBackend`: the model's
    generation_config, else transformers' own). `top_k=0` switches top-k off. `stop_token_ids`: a row
    ends at the first of these tokens, which is kept; None leaves stopping to the model's own eos, and
    the response mask then ends before the first pad. `extra` holds settings only one backend knows
    (transformers GenerationConfig keywords for `HFGenerationBackend`), rejected by a backend that does not.
    """

    max_new_tokens: int
    do_sample: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        checks = {
            "temperature": lambda v: v > 0,
            "top_k": lambda v: isinstance(v, int) and v >= 0,
            "top_p": lambda v: 0 < v <= 1,
            "min_p": lambda v: 0 <= v <= 1,
            "repetition_penalty": lambda v: v > 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise ValueError(f"{name} is out of range: {value!r}")
        if self.stop_token_ids is not None:
            stops = tuple(self.stop_token_ids)
            if not stops or not all(isinstance(t, int) and t >= 0 for t in stops):
                raise ValueError(
                    f"stop_token_ids must be a non-empty list of token ids, got {self.stop_token_ids!r}"
                )
            object.__setattr__(self, "stop_token_ids", stops)

    @classmethod
    def from_generation_config(cls, config: GenerationConfig, stop_token_ids: Sequence[int] | None = None):
        """The settings of a transformers GenerationConfig; those without a field here go to `extra`."""
        settings = {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_")}
        for key in ("transformers_version", "pad_token_id", "eos_token_id"):
            settings.pop(key, None)
        named = {f.name: settings.pop(f.name) for f in fields(cls) if f.name in settings}
        named["do_sample"] = bool(named.get("do_sample"))
        stops = tuple(stop_token_ids) if stop_token_ids is not None else None
        return cls(**named, stop_token_ids=stops, extra=settings)


@dataclass
class GenerationOutput:
    """Sampled completions, right-padded to `max_new_tokens` columns (R)."""

    responses: torch.Tensor  # (B, R) long, padded with the pad token after each row's end
    response_mask: torch.Tensor  # (B, R) bool, True = a real token (the stop token included)
    logprobs: torch.Tensor | None = None  # (B, R) float32 logprob of each sampled token; junk where masked
    values: torch.Tensor | None = None  # (B, R) float32 value-head output at each token; junk where masked
    # True: `logprobs` are of the distribution after truncation, penalties or a constraint (an engine's
    # processed logprobs), not softmax(raw logits / logprob_temperature); no stand-in for the old policy
    logprobs_processed: bool = False


class GenerationBackend:
    """What trainers need from a sampler: left-padded prompts in, completions and their logprobs out.

    `HFGenerationBackend` runs transformers `generate` in-process; a server or a continuous-batching
    engine can stand behind the same method without trainers changing: a backend checks nothing itself,
    `generate` checks the prompts once for all of them and hands them to the backend's `_sample`.
    """

    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        params: SamplingParams,
        *,
        logprob_temperature: float | None = None,
    ) -> GenerationOutput:
        """query_ids, query_mask: (B, Lq) left-padded prompts and their attention mask (1 = real).

        With `logprob_temperature`, also the logprob of every sampled token under softmax(raw model
        logits / logprob_temperature): the numbers a forward pass over prompt + completion gives.
        """
        if query_ids.shape != query_mask.shape or query_ids.dim() != 2:
            raise ValueError(
                f"query_ids and query_mask must both be (batch, length), got {tuple(query_ids.shape)} "
                f"and {tuple(query_mask.shape)}"
            )
        return self._sample(query_ids, query_mask, params, logprob_temperature)

    def _sample(self, query_ids, query_mask, params: SamplingParams, logprob_temperature) -> GenerationOutput:
        """`generate` after its checks; what a backend implements."""
        raise NotImplementedError


# `generation_backend` value -> "module:class" of its `GenerationBackend`
GENERATION_BACKENDS: dict[str, str] = {
    "rlhfkit": "rlhfkit.rollout.decoding:DecodeLoopBackend",  # the decode loop: same distribution, faster
    "transformers": "rlhfkit.rollout.generation:HFGenerationBackend",  # transformers `generate`
    # a `rlhfkit vllm-serve` server, over HTTP; trainers must also call its `sync_weights` after each update
    "vllm-server": "rlhfkit.rollout.vllm_client:VLLMServerBackend",
    # a vLLM engine in the training process (needs vLLM in the trainer's venv); `sync_weights` after updates
    "vllm-colocate": "rlhfkit.rollout.vllm_colocate:VLLMColocateBackend",
}


def make_generation_backend(
    model: torch.nn.Module,
    pad_token_id: int,
    *,
    engine: str = "rlhfkit",
    chunk_size: int | None = None,
    value_head: torch.nn.Module | None = None,
    weights_context: Callable[[], contextlib.AbstractContextManager] | None = None,
    progress: Callable[[int], None] | None = None,
    options: Mapping[str, Any] | None = None,
) -> GenerationBackend:
    """The sampler every trainer uses: `engine` is a key of `GENERATION_BACKENDS`; `options`, keyword
    arguments only that backend takes (a vLLM server's URL and timeout: `VLLMOptions.generation_engine`)."""
    if engine not in GENERATION_BACKENDS:
        raise ValueError(f"generation_backend must be one of {sorted(GENERATION_BACKENDS)}, got {engine!r}")
    module, name = GENERATION_BACKENDS[engine].split(":")
    backend = getattr(importlib.import_module(module), name)
    return backend(
        model,
        pad_token_id,
        chunk_size=chunk_size,
        value_head=value_head,
        weights_context=weights_context,
        progress=progress,
        **(options or {}),
    )


# the backends whose engine holds its own copy of the weights: made once per trainer and synced after updates
ENGINE_BACKENDS = ("vllm-server", "vllm-colocate")
