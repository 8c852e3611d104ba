"""`run_episodes`: multi-turn tool-calling rollouts on any `GenerationBackend`, token in, token out.

1. Sample one turn for every prompt, in one backend call.
2. Parse each turn that ended on a stop token; a row with tool calls (and rounds left) runs them.
3. Append the template's tokens for the tool results (`tool_suffix_ids`) to the sampled ids, unless they
   would leave no room under `max_completion_length` / `max_model_length`: then the results are dropped
   and the episode ends as it stands (as TRL rolls them back).
4. Sample the next turn of the rows that went on, together: each row's prompt is its prompt plus its
   completion so far, its budget what is left of `max_completion_length`. Back to 2.

The ids the backend sampled are appended as they are (never decoded and encoded again), so the trained
tokens and logprobs are the sampled ones. Departures from TRL: a tool result that leaves no token for the
model's reply is dropped too (TRL keeps one that fills the budget exactly, then samples nothing); a malformed
call is answered with an error message (TRL treats the turn as plain text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from rlhfkit.agents.episodes import Episode
from rlhfkit.agents.parsing import Turn, parse_turn, reply_text
from rlhfkit.agents.tools import ToolBox
from rlhfkit.agents.turns import tool_suffix_ids
from rlhfkit.rollout.backends import GenerationBackend, SamplingParams
from rlhfkit.rollout.generation import pad_left

MALFORMED_TOOL_NAME = "invalid_tool_call"  # the name on the error message answering a call that did not parse


def _check_arguments(prompt_ids, toolboxes, max_iterations, max_completion_length, max_model_length, timeout):
    if len(toolboxes) != len(prompt_ids):
        raise ValueError(
            f"toolboxes must hold one entry (a ToolBox or None) per prompt: got {len(toolboxes)} for "
            f"{len(prompt_ids)} prompts"
        )
    if any(box is not None and not isinstance(box, ToolBox) for box in toolboxes):
        raise ValueError("toolboxes entries must be ToolBox instances or None")
    for name, value, least, optional in (
        ("max_iterations", max_iterations, 0, True),
        ("max_completion_length", max_completion_length, 1, False),
        ("max_model_length", max_model_length, 1, True),
    ):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            expected = f"an integer >= {least}" + (" or None" if optional else "")
            raise ValueError(f"{name} must be {expected}, got {value!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"tool_timeout must be a positive number of seconds, got {timeout!r}")
    for i, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty: a turn is sampled after at least one prompt token")
        if max_model_length is not None and len(prompt) >= max_model_length:
            raise ValueError(
                f"prompt_ids[{i}] has {len(prompt)} tokens, leaving no room for a completion under "
                f"max_model_length={max_model_length}"
            )


def _room(episode: Episode, max_completion_length: int, max_model_length: int | None) -> int:
    """How many more tokens the episode may take: what is left of the completion budget and the context."""
    room = max_completion_length - len(episode.completion_ids)
    if max_model_length is not None:
        room = min(room, max_model_length - len(episode.prompt_ids) - len(episode.completion_ids))
    return room


def _sample_turn(
    backend: GenerationBackend,
    params: SamplingParams,
    episodes: list[Episode],
    budgets: list[int],
    stops: set[int],
    *,
    logprob_temperature: float | None,
    pad_token_id: int,
) -> list[bool]:
    """Sample one turn for each episode (cut to its budget) and append it; whether each ended on a stop."""
    contexts = [torch.tensor(e.prompt_ids + e.completion_ids, dtype=torch.long) for e in episodes]
    query_ids, query_mask = pad_left(contexts, pad_token_id)
    longest = max(budgets)
    out = backend.generate(
        query_ids,
        query_mask,
        dataclasses.replace(params, max_new_tokens=longest),
        logprob_temperature=logprob_temperature,
    )
    ended = []
    for row, (episode, budget) in enumerate(zip(episodes, budgets, strict=True)):
        real = out.response_mask[row].bool()
        ids = out.responses[row][real].tolist()
        logprobs = out.logprobs[row][real].tolist() if out.logprobs is not None else [0.0] * len(ids)
        stopped = bool(ids) and (ids[-1] in stops or len(ids) < longest)
        if len(ids) > budget:  # sampled past this row's own budget: the extra tokens were never its
            ids, logprobs, stopped = ids[:budget], logprobs[:budget], False
        episode.add_sampled(ids, logprobs)
        episode.truncated = not stopped
        ended.append(stopped)
    return ended


def _record_turn(
    episode: Episode, turn_ids: list[int], ended: bool, toolbox, tokenizer, chat_template
) -> Turn:
    """Parse the turn just sampled and add its assistant message; malformed calls count if it ended."""
    before = len(episode.completion_ids) - len(turn_ids)
    if toolbox is None:
        turn = Turn(content=reply_text(tokenizer, turn_ids).strip(), tool_calls=[], malformed=0)
    else:
        prefix = episode.prompt_ids + episode.completion_ids[:before]
        turn = parse_turn(tokenizer, turn_ids, prefix, toolbox.schemas, chat_template=chat_template)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    episode.messages.append(message)
    if ended:
        episode.malformed_calls += turn.malformed
    return turn


def _tool_messages(episode: Episode, turn: Turn, toolbox: ToolBox, timeout: float) -> list[dict]:
    """Run the turn's calls in order and answer each, then each malformed block, with a tool message."""
    messages = []
    for call in turn.tool_calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        result = toolbox.call(name, arguments, timeout)
        episode.tool_calls += 1
        episode.tool_errors += int(result.error)
        messages.append({"role": "tool", "name": name, "content": result.content})
    for problem in turn.problems:
        messages.append(
            {"role": "tool", "name": MALFORMED_TOOL_NAME, "content": f"error: malformed tool call: {problem}"}
        )
    return messages


def _append_results(
    episode: Episode, messages: list[dict], tokenizer, limits: tuple[int, int | None], chat_template, kwargs
) -> bool:
    """Append the tool results' tokens and messages; False (nothing appended) when they leave no room."""
    suffix = tool_suffix_ids(tokenizer, messages, chat_template, **kwargs)
    if _room(episode, *limits) - len(suffix) < 1:
        episode.truncated = True
        return False
    episode.add_inserted(suffix)
    episode.messages.extend(messages)
    return True


def run_episodes(
    backend: GenerationBackend,
    params: SamplingParams,
    prompt_ids: list[list[int]],
    toolboxes: Sequence[ToolBox | None],
    tokenizer: Any,
    *,
    max_iterations: int | None,
    max_completion_length: int,
    max_model_length: int | None,
    logprob_temperature: float | None,
    tool_timeout: float,
    pad_token_id: int,
    chat_template: str | None = None,
    template_kwargs: dict | None = None,
) -> list[Episode]:
    """One episode per prompt: turns sampled by `backend`, tool calls run from `toolboxes[i]` (None: a
    single plain turn), up to `max_iterations` rounds of tools (None: no cap).

    `prompt_ids`: the rendered prompts (tools listed by the chat template). `params.stop_token_ids` (or
    the tokenizer's EOS) end a turn; `chat_template` / `template_kwargs` render the tool results.
    """
    _check_arguments(
        prompt_ids, toolboxes, max_iterations, max_completion_length, max_model_length, tool_timeout
    )
    episodes = [Episode(prompt_ids=[int(t) for t in prompt]) for prompt in prompt_ids]
    stops = set(params.stop_token_ids or ()) | ({tokenizer.eos_token_id} - {None})
    limits = (max_completion_length, max_model_length)
    rows, rounds = list(range(len(episodes))), 0
    while rows:
        batch = [episodes[i] for i in rows]
        starts = [len(e.completion_ids) for e in batch]
        budgets = [_room(e, *limits) for e in batch]
        ended = _sample_turn(
            backend,
            params,
            batch,
            budgets,
            stops,
            logprob_temperature=logprob_temperature,
            pad_token_id=pad_token_id,
        )
        calling = []
        for i, start, stopped in zip(rows, starts, ended, strict=True):
            episode = episodes[i]
            turn = _record_turn(
                episode, episode.completion_ids[start:], stopped, toolboxes[i], tokenizer, chat_template
            )
            if stopped and toolboxes[i] is not None and (turn.tool_calls or turn.problems):
                calling.append((i, turn))
        if calling and max_iterations is not None and rounds >= max_iterations:
            for i, _ in calling:
                episodes[i].hit_iteration_cap = True
            break
        rows = [
            i
            for i, turn in calling
            if _append_results(
                episodes[i],
                _tool_messages(episodes[i], turn, toolboxes[i], tool_timeout),
                tokenizer,
                limits,
                chat_template,
                template_kwargs or {},
            )
        ]
        rounds += 1
    return episodes
