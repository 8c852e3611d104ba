"""`HFGenerationBackend`: the `GenerationBackend` over transformers `generate`, and the padding helpers.

Completions are cut after their first stop token (kept, mask True); the rest becomes pad (mask False).
Sampling logprobs stream out of generation (`rollout.streaming`), one (batch, vocab) row at a time.
The interface, the sampling settings and the registry of backends are in `rollout.backends`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from rlhfkit.core.masking import truncate_at_stop
from rlhfkit.models.eval_mode import eval_mode
from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput, SamplingParams
from rlhfkit.rollout.packed_linear import packed_linears
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
    """Stack 1-D tensors into a right-padded (B, L) batch and its mask (True = real). The batch keeps the
    first sequence's dtype: token ids, or per-token values such as logprobs (padded with `pad_token_id`)."""
    if len(sequences) == 0:
        raise ValueError("pad_right needs at least one sequence")
    length = max(1, max(int(s.numel()) for s in sequences))
    first = sequences[0]
    ids = torch.full((len(sequences), length), pad_token_id, dtype=first.dtype, device=first.device)
    mask = torch.zeros((len(sequences), length), dtype=torch.bool, device=sequences[0].device)
    for i, seq in enumerate(sequences):
        n = int(seq.numel())
        ids[i, :n] = seq.reshape(-1)
        mask[i, :n] = True
    return ids, mask


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


class HFGenerationBackend(GenerationBackend):
    """`GenerationBackend` over transformers `generate`, `chunk_size` prompts at a time (memory bound).

    Runs under `torch.no_grad` with dropout off (each submodule's mode restored after), on a CPU with the
    large linear layers in oneDNN's format (`packed_linear`). Each chunk drops
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
        settings.update(
            max_new_tokens=params.max_new_tokens, do_sample=params.do_sample, pad_token_id=self.pad_token_id
        )
        named = ["repetition_penalty"] + (
            ["temperature", "top_k", "top_p", "min_p"] if params.do_sample else []
        )
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
            raise ValueError(
                "logprob_temperature needs one sequence per prompt: beam search (num_beams > 1) reorders rows"
            )
        n = query_ids.shape[0]
        chunk = self.chunk_size or n
        pieces = []
        with (
            self.weights_context(),
            eval_mode(self.model),
            packed_linears(self.model),  # on a CPU: oneDNN for the large matrices (`packed_linear`)
            lm_head_inputs(self.model, self.value_head is not None) as hidden,
        ):
            for start in range(0, n, chunk):
                rows = slice(start, start + chunk)
                hidden.clear()
                pieces.append(
                    self._generate_chunk(
                        query_ids[rows], query_mask[rows], config, logprob_temperature, hidden
                    )
                )
                if self.progress is not None:
                    self.progress(pieces[-1][0].shape[0])
        return self._assemble(pieces, params, query_ids.device)

    def _generate_chunk(self, ids, mask, config, logprob_temperature, hidden) -> tuple:
        first = int(mask.any(0).long().argmax())  # columns before it are padding in every row of the chunk
        ids, mask = ids[:, first:], mask[:, first:]
        streamed = StreamedLogprobs(logprob_temperature) if logprob_temperature is not None else None
        extra = {"logits_processor": LogitsProcessorList([streamed])} if streamed is not None else {}
        with streamed.attached(self.model) if streamed is not None else contextlib.nullcontext():
            sequences = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=config, **extra
            )
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
        logprobs = (
            torch.zeros((n, width), dtype=torch.float32, device=device) if pieces[0][1] is not None else None
        )
        values = (
            torch.zeros((n, width), dtype=torch.float32, device=device) if pieces[0][2] is not None else None
        )
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
