"""What transformers `generate` computes anyway, kept while it samples: chosen-token logprobs, hidden states.

Asking `generate` for `output_logits` keeps one (batch, vocab) float32 row per step until the end, a
(batch x length x vocab) stack: 10 GB for 16 completions of 1,024 tokens with a 152k vocabulary.
`StreamedLogprobs` keeps the log-softmax row of one step only until the next step reveals which token
was sampled from it, then keeps that one number: (batch x vocab) extra memory at any time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import GenerationMixin, LogitsProcessor


def generating_module(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose forward `model.generate` calls (inside value-head and PEFT wrappers)."""
    found = next((m for m in model.modules() if isinstance(m, GenerationMixin)), None)
    if found is None:
        raise ValueError(f"{type(model).__name__} holds no transformers generation model")
    return found


class StreamedLogprobs(LogitsProcessor):
    """Log-probability of each sampled token under softmax(raw logits / temperature), one step at a time.

    The raw logits are what the model returned, before any logits processor (repetition penalty,
    temperature, top-k...), read by a forward hook: the numbers a forward pass over prompt + completion
    gives. Placed last among the processors, this one sees the sequence so far, whose last column is the
    token sampled from the previous step's row; the last step's token is read from the output sequences.
    """

    def __init__(self, temperature: float = 1.0):
        if not temperature > 0:
            raise ValueError(f"logprob temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self._latest: torch.Tensor | None = None  # raw logits of the step being processed, (B, V)
        self._pending: torch.Tensor | None = None  # log-softmax row waiting for its sampled token, (B, V)
        self._steps: list[torch.Tensor] = []  # (B, 1) logprob of each sampled token so far

    def _capture(self, module, args, output) -> None:
        self._latest = output.logits[:, -1]

    @contextlib.contextmanager
    def attached(self, model: torch.nn.Module) -> Iterator[StreamedLogprobs]:
        """Hook the forward of `model`'s generation model for the duration of one `generate` call."""
        self._latest, self._pending, self._steps = None, None, []
        handle = generating_module(model).register_forward_hook(self._capture)
        try:
            yield self
        finally:
            handle.remove()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self._latest is None:
            raise RuntimeError("StreamedLogprobs saw no model output: use it inside `attached(model)`")
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]))
        row = torch.log_softmax(self._latest.float() / self.temperature, dim=-1)
        # kept in one buffer for the whole call: a fresh (B, V) block per step, freed a step later, made glibc
        # keep the blocks freed around it (1.3 GB at 16 x 151,936 over 256 steps)
        if self._pending is None or self._pending.shape != row.shape:
            self._pending = row
        else:
            self._pending.copy_(row)
        self._latest = None
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """(B, T) float32 logprobs of the `generated` (B, T) tokens; frees the last row.

        `generate` may run a step or two past the end and then drop them, so only the first T steps count.
        """
        steps = self._steps
        if self._pending is not None and len(steps) < generated.shape[1]:
            steps = [*steps, self._pending.gather(-1, generated[:, len(steps) : len(steps) + 1])]
        self._pending, self._steps = None, []
        if not steps:
            return torch.zeros(generated.shape, dtype=torch.float32, device=generated.device)
        return torch.cat(steps, dim=1)[:, : generated.shape[1]]


@contextlib.contextmanager
def lm_head_inputs(model: torch.nn.Module, active: bool) -> Iterator[list[torch.Tensor]]:
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
