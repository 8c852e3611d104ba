"""A GenerationBackend that answers each prompt with turns written in advance, for rollout tests.

Each conversation is keyed by its prompt ids; call k for a row whose context starts with that prompt returns
the conversation's k-th scripted turn (cut to max_new_tokens, as a real sampler stops), with logprobs made up
from the token ids and the turn number so a test can tell exactly which turn each logprob came from.
"""

from __future__ import annotations

import torch

from rlhfkit.rollout import GenerationBackend, GenerationOutput


def scripted_logprobs(ids: list[int], turn: int) -> list[float]:
    """The logprobs the scripted backend reports for `ids` sampled as turn number `turn` (0-based)."""
    return [-(turn + 1) - (t % 8) / 8 for t in ids]  # eighths: exact in float32


def char_ids(tokenizer, text: str) -> list[int]:
    """`text` spelt one token per character: what a sampler may produce, but never what encoding gives."""
    ids = []
    for char in text:
        pieces = tokenizer(char, add_special_tokens=False)["input_ids"]
        assert len(pieces) == 1, f"{char!r} is not a single token"
        ids += pieces
    return ids


class ScriptedBackend(GenerationBackend):
    def __init__(self, scripts: dict[tuple[int, ...], list[list[int]]], pad_token_id: int):
        self.scripts = scripts
        self.served = {prompt: 0 for prompt in scripts}
        self.pad_token_id = pad_token_id
        self.calls: list[dict] = []  # per generate call: the contexts (unpadded) and max_new_tokens

    def _script_of(self, context: list[int]) -> tuple[int, ...]:
        matches = [p for p in self.scripts if tuple(context[: len(p)]) == p]
        assert len(matches) == 1, "every context starts with exactly one scripted prompt"
        return matches[0]

    def _sample(self, query_ids, query_mask, params, logprob_temperature) -> GenerationOutput:
        contexts = [row[mask.bool()].tolist() for row, mask in zip(query_ids, query_mask, strict=True)]
        self.calls.append({"contexts": contexts, "max_new_tokens": params.max_new_tokens})
        width = params.max_new_tokens
        responses = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.bool)
        logprobs = torch.zeros((len(contexts), width), dtype=torch.float32)
        for row, context in enumerate(contexts):
            prompt = self._script_of(context)
            turn = self.served[prompt]
            self.served[prompt] += 1
            ids = self.scripts[prompt][turn][:width]
            responses[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = True
            logprobs[row, : len(ids)] = torch.tensor(scripted_logprobs(ids, turn))
        return GenerationOutput(responses, mask, logprobs if logprob_temperature is not None else None)


class ScriptedFirstTurn(GenerationBackend):
    """Turn 1 from a script (the tiny model would not call a tool by itself), later turns from `inner`."""

    def __init__(self, first: list[int], inner: GenerationBackend):
        self.first, self.inner, self.turn = first, inner, 0

    def _sample(self, query_ids, query_mask, params, logprob_temperature):
        self.turn += 1
        if self.turn > 1:
            return self.inner.generate(query_ids, query_mask, params, logprob_temperature=logprob_temperature)
        ids = torch.tensor([self.first] * len(query_ids))
        return GenerationOutput(ids, torch.ones_like(ids, dtype=torch.bool), torch.zeros(ids.shape))
