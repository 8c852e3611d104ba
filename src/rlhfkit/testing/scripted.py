"""A sampler that writes replies a test chooses, for multi-turn (tool-calling) runs of the real trainers.

An untrained tiny model never writes a well-formed tool call; tests of the agent paths need rows that do.
`scripted_sampler(model, tokenizer, script)` is a `GenerationBackend` whose reply to row `row` of a call is
`script(context, row)` (context: that row's prompt plus its completion so far, decoded with the special
tokens) followed by the EOS token, cut at `max_new_tokens`. Its logprobs are the model's own for those
tokens (one forward pass), as a real sampler's would be, so the trainer's sampling-gap checks hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def scripted_sampler(model: Any, tokenizer: Any, script: Callable[[str, int], str]) -> Any:
    """A GenerationBackend replying `script(context, row)` + EOS to each row (the class is made here: it
    subclasses `rollout`'s interface, which `testing` may not import at module level)."""
    import torch

    from rlhfkit.rollout import forward_response
    from rlhfkit.rollout.backends import GenerationBackend, GenerationOutput
    from rlhfkit.rollout.generation import pad_right

    class ScriptedSampler(GenerationBackend):
        def _sample(self, query_ids, query_mask, params, logprob_temperature) -> GenerationOutput:
            replies = []
            for row, (ids, mask) in enumerate(zip(query_ids, query_mask.bool())):
                context = tokenizer.decode(ids[mask], skip_special_tokens=False)
                reply = tokenizer.encode(script(context, row), add_special_tokens=False)
                replies.append(torch.tensor([*reply, tokenizer.eos_token_id][: params.max_new_tokens]))
            responses, response_mask = pad_right(replies, tokenizer.pad_token_id)
            responses, response_mask = responses.to(query_ids.device), response_mask.to(query_ids.device)
            with torch.no_grad():
                logprobs = forward_response(
                    model, query_ids, query_mask, responses, response_mask,
                    temperature=logprob_temperature or 1.0,
                ).logprobs  # fmt: skip
            return GenerationOutput(responses, response_mask.bool(), logprobs)

    return ScriptedSampler()
