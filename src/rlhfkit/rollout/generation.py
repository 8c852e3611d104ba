"""The one generation path of every trainer: left-padded prompts in, right-padded completions out.

`GenerationBackend` is the interface trainers call; `SamplingParams` holds temperature, top-k/top-p,
lengths and stop tokens in one place; `HFGenerationBackend` implements it with transformers `generate`.
Completions are cut after their first stop token (kept, mask True); the rest becomes pad (mask False).
Sampling logprobs stream out of generation (`rollout.streaming`), one (batch, vocab) row at a time.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from rlhfkit.core.masking import truncate_at_stop
from rlhfkit.models.eval_mode import eval_mode
from rlhfkit.rollout.streaming import StreamedLogprobs, lm_head_inputs


class LengthSampler:
    """Callable returning an integer drawn uniformly from [min_value, max_value)."""

    def __init__(self, min_value: int, max_value: int):
        if not 0 < min_value < max_value:
            raise ValueError(f"LengthSampler needs 0 < min_value < max_value, got {min_value}, {max_value}")
        self.values = list(range(min_value, max_value))

    def __call__(self) -> int:
        return random.choice(self.values)


def pad_left(sequences: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D token tensors into a left-padded (B, L) batch and its attention mask (1 = real)."""
    if len(sequences) == 0:
        raise ValueError("pad_left needs at least one sequence")
    length = max(int(s.numel()) for s in sequences)
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long, device=sequences[0].device)
    mask = torch.zeros((len(sequences), length), dtype=torch.long, device=sequences[0].device)
    for i, seq in enumerate(sequences):
        n = int(seq.numel())
        if n:
            ids[i, length - n :] = seq.reshape(-1)
            mask[i, length - n :] = 1
    return ids, mask


def pad_right(sequences: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D token tensors into a right-padded (B, L) batch and its mask (True = real)."""
    if len(sequences) == 0:
        raise ValueError("pad_right needs at least one sequence")
    length = max(1, max(int(s.numel()) for s in sequences))
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long, device=sequences[0].device)
    mask = torch.zeros((len(sequences), length), dtype=torch.bool, device=sequences[0].device)
    for i, seq in enumerate(sequences):
        n = int(seq.numel())
        ids[i, :n] = seq.reshape(-1)
        mask[i, :n] = True
    return ids, mask


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


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
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
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
                raise ValueError(f"stop_token_ids must be a non-empty list of token ids, got {self.stop_token_ids!r}")
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


class HFGenerationBackend(GenerationBackend):
    """`GenerationBackend` over transformers `generate`, `chunk_size` prompts at a time (memory bound).

    Runs under `torch.no_grad` with dropout off (each submodule's mode restored after). Each chunk drops
    the pad columns none of its prompts needs. `weights_context` is entered once per call (e.g. gathering
    ZeRO-3 shards); `value_head` also returns its output on the final hidden state before each token
    (decoder-only models); `progress(n)` is called after each chunk of n prompts.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        chunk_size: int | None = None,
        value_head: torch.nn.Module | None = None,
        weights_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        progress: Callable[[int], None] | None = None,
    ):
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        if value_head is not None and is_encoder_decoder(model):
            raise ValueError("value_head is supported for decoder-only models only")
        self.model, self.pad_token_id, self.chunk_size = model, pad_token_id, chunk_size
        self.value_head, self.progress = value_head, progress
        self.weights_context = weights_context or contextlib.nullcontext

    def generation_config(self, params: SamplingParams) -> GenerationConfig:
        """The transformers GenerationConfig that samples with `params`."""
        settings: dict[str, Any] = dict(params.extra)
        settings.update(max_new_tokens=params.max_new_tokens, do_sample=params.do_sample, pad_token_id=self.pad_token_id)
        named = ["repetition_penalty"] + (["temperature", "top_k", "top_p", "min_p"] if params.do_sample else [])
        settings.update({name: getattr(params, name) for name in named if getattr(params, name) is not None})
        if params.stop_token_ids is not None:
            stops = params.stop_token_ids
            settings["eos_token_id"] = stops[0] if len(stops) == 1 else list(stops)
        config = GenerationConfig()
        unknown = config.update(**settings)
        if unknown:
            raise ValueError(f"SamplingParams.extra has unknown generation settings {sorted(unknown)}")
        return config

    @torch.no_grad()
    def _sample(self, query_ids, query_mask, params: SamplingParams, logprob_temperature) -> GenerationOutput:
        config = self.generation_config(params)
        if logprob_temperature is not None and (config.num_beams or 1) > 1:
            raise ValueError("logprob_temperature needs one sequence per prompt: beam search (num_beams > 1) reorders rows")
        n = query_ids.shape[0]
        chunk = self.chunk_size or n
        pieces = []
        with self.weights_context(), eval_mode(self.model), lm_head_inputs(self.model, self.value_head is not None) as hidden:
            for start in range(0, n, chunk):
                rows = slice(start, start + chunk)
                hidden.clear()
                pieces.append(self._generate_chunk(query_ids[rows], query_mask[rows], config, logprob_temperature, hidden))
                if self.progress is not None:
                    self.progress(pieces[-1][0].shape[0])
        return self._assemble(pieces, params, query_ids.device)

    def _generate_chunk(self, ids, mask, config, logprob_temperature, hidden) -> tuple:
        first = int(mask.any(0).long().argmax())  # columns before it are padding in every row of the chunk
        ids, mask = ids[:, first:], mask[:, first:]
        streamed = StreamedLogprobs(logprob_temperature) if logprob_temperature is not None else None
        extra = {"logits_processor": LogitsProcessorList([streamed])} if streamed is not None else {}
        with streamed.attached(self.model) if streamed is not None else contextlib.nullcontext():
            sequences = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **extra)
        # decoder outputs start with the decoder start token; causal outputs repeat the query
        piece = sequences[:, 1:] if is_encoder_decoder(self.model) else sequences[:, ids.shape[1] :]
        logprobs = streamed.finish(piece) if streamed is not None else None
        values = None
        if self.value_head is not None:  # one LM-head input per step; the prefill's last position first
            states = torch.stack([h[:, -1] for h in hidden[: piece.shape[1]]], dim=1)
            values = self.value_head(states).float().reshape(piece.shape)
        return piece, logprobs, values

    def _assemble(self, pieces, params: SamplingParams, device) -> GenerationOutput:
        """Pieces of varying width -> (B, max_new_tokens) tensors, rows cut after their first stop token."""
        n, width = sum(p[0].shape[0] for p in pieces), params.max_new_tokens
        responses = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((n, width), dtype=torch.float32, device=device) if pieces[0][1] is not None else None
        values = torch.zeros((n, width), dtype=torch.float32, device=device) if pieces[0][2] is not None else None
        row = 0
        for piece in pieces:
            rows, cols = slice(row, row + piece[0].shape[0]), slice(0, min(piece[0].shape[1], width))
            for target, source in zip((responses, logprobs, values), piece):
                if target is not None:
                    target[rows, cols] = source[:, :width]
            row += piece[0].shape[0]
        if params.stop_token_ids is None:
            responses, response_mask = truncate_at_stop(responses, None, self.pad_token_id)
        else:  # the first of several stop tokens: cut the 0/1 "is a stop token" row at its first 1
            is_stop = torch.isin(responses, torch.tensor(params.stop_token_ids, device=device))
            response_mask = truncate_at_stop(is_stop.long(), 1, 0)[1]
            responses = responses.masked_fill(~response_mask, self.pad_token_id)
        return GenerationOutput(responses, response_mask, logprobs, values)
