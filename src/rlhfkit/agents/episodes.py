"""`Episode`: one multi-turn rollout as the trainer sees it, and the tool metrics of a batch of them.

The completion holds every turn's tokens in order, the model's and the ones inserted for tool results, with
`model_mask` telling them apart (True = sampled by the model): the trainer keeps the inserted tokens in the
sequence, so the model conditions on them, and out of the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Episode:
    """One prompt's conversation: ids, which of them the model sampled, and what happened on the way.

    `logprobs` are the sampler's, one per completion token (0.0 where inserted, and everywhere when the
    backend returned none). `messages` are the assistant and tool messages in order. `truncated`: the last
    turn was cut by `max_completion_length` / the context, or a tool result did not fit and was left out.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    model_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    turns: int = 0
    inserted_tokens: int = 0
    hit_iteration_cap: bool = False
    truncated: bool = False

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Append a turn the model sampled, with the logprob of each of its tokens."""
        if len(ids) != len(logprobs):
            raise ValueError(
                f"a sampled turn needs one logprob per token, got {len(ids)} and {len(logprobs)}"
            )
        self.completion_ids.extend(int(t) for t in ids)
        self.model_mask.extend([True] * len(ids))
        self.logprobs.extend(float(lp) for lp in logprobs)
        self.turns += 1

    def add_inserted(self, ids: Sequence[int]) -> None:
        """Append tokens the model did not sample (tool results and the template's turn markers)."""
        self.completion_ids.extend(int(t) for t in ids)
        self.model_mask.extend([False] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.inserted_tokens += len(ids)

    @property
    def model_tokens(self) -> int:
        """How many completion tokens the model sampled (what completion lengths count, as in TRL)."""
        return sum(self.model_mask)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Tool metrics of a batch: TRL's `tools/call_frequency` (calls per episode) and
    `tools/failure_frequency` (failed calls / calls, 0 without calls), and rlhfkit's per-episode means of
    tool errors, malformed calls, turns and inserted tokens, and the fraction of episodes that hit the
    iteration cap."""
    if not episodes:
        raise ValueError("episode_metrics needs at least one episode")
    n = len(episodes)
    calls = sum(e.tool_calls for e in episodes)
    errors = sum(e.tool_errors for e in episodes)
    return {
        "tools/call_frequency": calls / n,
        "tools/failure_frequency": errors / calls if calls else 0.0,
        "tools/errors": errors / n,
        "tools/malformed": sum(e.malformed_calls for e in episodes) / n,
        "tools/turns_mean": sum(e.turns for e in episodes) / n,
        "tools/inserted_tokens_mean": sum(e.inserted_tokens for e in episodes) / n,
        "tools/iteration_cap_frac": sum(e.hit_iteration_cap for e in episodes) / n,
    }
