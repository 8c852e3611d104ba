"""Batched generation of responses for RL: left-padded queries in, right-padded responses out.

Responses are cut after the first stop token (kept, mask True); the rest becomes pad (mask False).
Generation runs with the model in eval mode (no dropout) and under `torch.no_grad`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence

import torch
from transformers import GenerationConfig

from rlhfkit.core.masking import truncate_at_stop


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


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Temporarily switch off dropout; afterwards restore every submodule's own train/eval mode.

    Restoring per submodule (not `model.train(was_training)`) keeps parts that were deliberately in eval,
    such as a frozen reference or reward head, in eval.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


@torch.no_grad()
def generate_responses(
    model: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    generation_config: GenerationConfig,
    *,
    pad_token_id: int,
    stop_token_id: int | None = None,
    chunk_size: int | None = None,
    with_logprobs: bool = False,
    logprob_temperature: float | None = None,
    value_head: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, ...]:
    """Sample one response per left-padded query.

    Args:
        query_ids, query_mask: (B, Lq) left-padded queries and their attention mask.
        generation_config: sampling settings; `max_new_tokens` bounds the response length R.
        stop_token_id: responses are cut after its first occurrence (usually eos). Generation stops early
            once every sequence in a chunk has produced it.
        chunk_size: generate at most this many queries at once (memory bound).
        with_logprobs: also return the (B, R) float32 log-probabilities of the sampled tokens under
            softmax(logits / temperature), read from the logits generation computed anyway, so no second
            forward pass is needed (equal to `forward_response` up to float rounding; junk where masked).
        logprob_temperature: divide the logits by this instead of the sampling temperature (PPO scores
            with the raw model, 1.0, whatever temperature sampled).
        value_head: also return (B, R) float32 values, this head applied to the final hidden state that
            predicted each token: the input of the LM head, captured by a hook, so again no second pass
            (decoder-only models).

    Returns:
        responses (B, R) right-padded with `pad_token_id`, and response_mask (B, R) bool
        (then logprobs (B, R) when `with_logprobs`, then values (B, R) when `value_head` is given).
    """
    if query_ids.shape != query_mask.shape or query_ids.dim() != 2:
        raise ValueError(
            f"query_ids and query_mask must both be (batch, length), got {tuple(query_ids.shape)} "
            f"and {tuple(query_mask.shape)}"
        )
    max_new = generation_config.max_new_tokens
    if not max_new or max_new <= 0:
        raise ValueError("generation_config.max_new_tokens must be a positive integer")
    config = GenerationConfig.from_dict(generation_config.to_dict())
    config.pad_token_id = pad_token_id
    if stop_token_id is not None:
        config.eos_token_id = stop_token_id
    encoder_decoder = is_encoder_decoder(model)
    if value_head is not None and encoder_decoder:
        raise ValueError("value_head is supported for decoder-only models only")
    if with_logprobs:
        config.output_logits, config.return_dict_in_generate = True, True
    temperature = float(config.temperature or 1.0) if config.do_sample else 1.0
    if logprob_temperature is not None:
        temperature = float(logprob_temperature)
    chunk = chunk_size or query_ids.shape[0]
    pieces, logprob_pieces, value_pieces = [], [], []
    with eval_mode(model), _lm_head_inputs(model, value_head is not None) as hidden:
        for start in range(0, query_ids.shape[0], chunk):
            ids = query_ids[start : start + chunk]
            mask = query_mask[start : start + chunk]
            hidden.clear()
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            sequences = out.sequences if with_logprobs else out
            # decoder outputs start with the decoder start token; causal outputs repeat the query
            piece = sequences[:, 1:] if encoder_decoder else sequences[:, ids.shape[1] :]
            pieces.append(piece)
            if with_logprobs:  # one (b, V) logits tensor per generated step, before any logits processor
                steps = [
                    torch.log_softmax(step.float() / temperature, -1).gather(-1, token[:, None])
                    for step, token in zip(out.logits, piece.T)
                ]
                logprob_pieces.append(torch.cat(steps, dim=1))
            if value_head is not None:  # one LM-head input per step; the prefill's last position first
                states = torch.stack([h[:, -1] for h in hidden[: piece.shape[1]]], dim=1)
                value_pieces.append(value_head(states).float())
    responses = torch.full((query_ids.shape[0], max_new), pad_token_id, dtype=torch.long, device=query_ids.device)
    logprobs = torch.zeros(responses.shape, dtype=torch.float32, device=query_ids.device)
    values = torch.zeros(responses.shape, dtype=torch.float32, device=query_ids.device)
    row = 0
    for i, piece in enumerate(pieces):
        rows, cols = slice(row, row + piece.shape[0]), slice(0, min(piece.shape[1], max_new))
        responses[rows, cols] = piece[:, :max_new]
        if with_logprobs:
            logprobs[rows, cols] = logprob_pieces[i][:, :max_new]
        if value_head is not None:
            values[rows, cols] = value_pieces[i][:, :max_new]
        row += piece.shape[0]
    if stop_token_id is None:
        # no stop token: every generated position up to the first pad is real
        response_mask = torch.cumprod((responses != pad_token_id).long(), dim=1).bool()
        result = (responses, response_mask)
    else:
        result = truncate_at_stop(responses, stop_token_id, pad_token_id)
    result += (logprobs,) if with_logprobs else ()
    return result + (values,) if value_head is not None else result


@contextlib.contextmanager
def _lm_head_inputs(model: torch.nn.Module, active: bool) -> Iterator[list[torch.Tensor]]:
    """Collect the input of the model's LM head at every call (the final, normed hidden states)."""
    captured: list[torch.Tensor] = []
    if not active:
        yield captured
        return
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings to read hidden states from")
    handle = head.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    try:
        yield captured
    finally:
        handle.remove()
