"""Steps 1-2 of GRPO's generation batch when completions are multi-turn: tool-calling episodes, or the user's
`rollout_func` (set up by `agent_setup`).

With tools or environments, every rollout gets its own environment (reset with its dataset row; text that
`reset` returns is appended to the last user message), its prompt is rendered with the schemas of the tools
it may call, and `agents.rollout.run_episodes` samples, runs the calls and samples again. A rollout's
completion holds every turn, tool results included: those tokens stay in the sequence (the policy reads
them) but not in the loss (`loss_mask = response_mask & model_mask`), the sampling logprob gap, the KL or
the logged lengths. Reward functions get the whole conversation as `completions` (assistant and tool
messages) and, with environments, `environments=`, one per rollout.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import torch
from accelerate.utils import gather_object

from rlhfkit.agents.episodes import episode_metrics
from rlhfkit.agents.rollout import run_episodes
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.generation import pad_left, pad_right
from rlhfkit.trainers.common.prompts import context_length, prompt_ids
from rlhfkit.trainers.grpo.groups import SampledGroups

ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")  # what rollout_func must return
# what `episode_metrics` reads of each episode (gathered from every process)
EPISODE_COUNTERS = (
    "tool_calls",
    "tool_errors",
    "malformed_calls",
    "turns",
    "inserted_tokens",
    "hit_iteration_cap",
)


def _right_padded(rows: list[list], dtype: torch.dtype) -> torch.Tensor:
    """Each row's values as `dtype`, right-padded with zeros (one row per completion, as wide as its ids)."""
    return pad_right([torch.tensor(row, dtype=dtype) for row in rows], 0)[0]


def sequences_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    logprobs: list[list[float]],
    model_mask: list[list[bool]] | None,
    pad_token_id: int,
    device: Any,
) -> RolloutBatch:
    """A RolloutBatch of token-id lists: prompts left-padded, completions right-padded; `model_mask` (None:
    every token sampled) also narrows `loss_mask`. Logprobs at inserted positions are set to 0."""
    query_ids, query_mask = pad_left([torch.tensor(p, dtype=torch.long) for p in prompt_ids], pad_token_id)
    responses, response_mask = pad_right(
        [torch.tensor(c, dtype=torch.long) for c in completion_ids], pad_token_id
    )
    sampled = None if model_mask is None else _right_padded(model_mask, torch.bool) & response_mask
    lp = _right_padded(logprobs, torch.float32)
    if sampled is not None:
        lp = lp.masked_fill(~sampled, 0.0)
    loss_mask = response_mask if sampled is None else sampled
    batch = RolloutBatch(query_ids, query_mask, responses, response_mask, loss_mask, logprobs=lp,
                         model_mask=sampled)  # fmt: skip
    return batch.to(device)


def check_rollout_output(output: Any, n: int) -> dict[str, Any]:
    """`rollout_func`'s output checked: a dict with one prompt, completion and logprob list per prompt
    (`env_mask` too when given, 1 = sampled by the model); extra keys are lists of n, for reward functions."""
    if not isinstance(output, dict):
        raise TypeError(f"rollout_func must return a dict, got {type(output).__name__}")
    missing = [key for key in ROLLOUT_KEYS if key not in output]
    if missing:
        raise ValueError(
            f"rollout_func must return {', '.join(ROLLOUT_KEYS)}; its output lacks {', '.join(missing)} "
            f"(it has {sorted(output)})"
        )
    for key, value in output.items():
        if not isinstance(value, (list, tuple)) or len(value) != n:
            size = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(
                f"rollout_func's {key!r} must be a list with one entry per prompt ({n}), got {size}"
            )
    for key in [k for k in ("logprobs", "env_mask") if k in output]:
        for row, (ids, values) in enumerate(zip(output["completion_ids"], output[key])):
            if len(values) != len(ids):
                raise ValueError(
                    f"rollout_func's {key!r} row {row} has {len(values)} entries for {len(ids)} completion "
                    "tokens; give one per token"
                )
    return output


def with_observation(prompt: list[dict], observation: Any) -> list[dict]:
    """`prompt` (chat messages) with what an environment's `reset` returned appended to its last message (a
    copy; None or "": unchanged)."""
    if observation is None or observation == "":
        return prompt
    content = prompt[-1]["content"]
    if isinstance(content, list):  # typed content blocks
        extra = [{"type": "text", "text": observation}] if isinstance(observation, str) else list(observation)
        content = content + extra
    elif isinstance(observation, str):
        content = content + observation
    else:
        raise TypeError(
            f"reset returned {type(observation).__name__}; return a str (or None) for a text prompt"
        )
    return [*prompt[:-1], {**prompt[-1], "content": content}]


def check_prompt_lengths(prompt_ids: list[list[int]], max_prompt_length: int | None, owner: str) -> None:
    """ValueError when a prompt rendered with its tools is longer than `max_prompt_length`: keeping its last
    tokens, as plain prompts are cut, would drop the tool list at its start."""
    longest = max(len(ids) for ids in prompt_ids)
    if max_prompt_length and longest > max_prompt_length:
        raise ValueError(
            f"{owner}: a prompt rendered with its tools has {longest} tokens, more than max_prompt_length="
            f"{max_prompt_length}; cutting it would drop the tools listed at its start: raise "
            "max_prompt_length (or set it to None)"
        )


def conversation_text(messages: list[dict]) -> str:
    """An episode's assistant and tool messages as lines of text (the completions table): each tool call as
    `name({arguments})`, each tool result after the name of its tool."""
    lines = []
    for message in messages:
        calls = [
            f"{c['function']['name']}({json.dumps(c['function']['arguments'])})"
            for c in message.get("tool_calls") or []
        ]
        who = message["role"] if message["role"] != "tool" else f"tool {message.get('name', '')}".strip()
        lines.append(f"[{who}] " + " ".join([message.get("content") or "", *calls]).strip())
    return "\n".join(lines)


class AgentSamplingMethods:
    """Mixed into `GRPOTrainer`; relies on its `args`, `agents`, `processing_class`, `accelerator`,
    `sampling_params`, `_sampler`, `_owner` and `_scored_groups`."""

    def _agent_groups(self, rows: dict[str, list], num_generations: int) -> SampledGroups:
        """`num_generations` completions of each prompt of `rows`: tool-calling episodes or rollout_func's."""
        repeat = [i for i in range(len(rows["input_ids"])) for _ in range(num_generations)]
        columns = {k: [v[i] for i in repeat] for k, v in rows.items()}
        if not self.agents.uses_tools:
            return self._custom_rollout_groups(columns)
        args, tok = self.args, self.processing_class
        prompts = columns.pop("prompt", None)
        if prompts is None or not all(isinstance(p, list) for p in prompts):
            raise ValueError(
                f"{self._owner}: tools and environments need chat prompts: a 'prompt' column of message lists"
            )
        ids = columns.pop("input_ids")
        # reset gets the whole row, its prompt included (TRL)
        environments, observations = self.agents.start_environments(
            {**columns, "prompt": prompts}, self._owner
        )
        prompts = [with_observation(p, o) for p, o in zip(prompts, observations)]
        toolboxes = [self.agents.toolbox(e) for e in environments or [None] * len(ids)]
        template_kwargs = dict(args.chat_template_kwargs or {})
        ids = [
            prompt_ids(p, tok, {**template_kwargs, "tools": b.schemas or None})
            for p, b in zip(prompts, toolboxes)
        ]
        check_prompt_lengths(ids, args.max_prompt_length, self._owner)
        episodes = run_episodes(
            self._sampler(), self.sampling_params, ids, toolboxes, tok,
            max_iterations=args.max_tool_calling_iterations, max_completion_length=args.max_completion_length,
            max_model_length=self._max_model_length(), logprob_temperature=args.temperature,
            tool_timeout=args.tool_timeout, pad_token_id=tok.pad_token_id, template_kwargs=template_kwargs,
        )  # fmt: skip
        self._episodes.extend(episodes)
        batch = sequences_batch(
            [e.prompt_ids for e in episodes], [e.completion_ids for e in episodes],
            [e.logprobs for e in episodes], [e.model_mask for e in episodes], tok.pad_token_id,
            self.accelerator.device,
        )  # fmt: skip
        replies = [list(e.messages) for e in episodes]
        extras = {} if environments is None else {"environments": environments}
        processed = any(e.logprobs_processed for e in episodes)
        groups = self._scored_groups(
            batch, prompts, columns, replies=replies, extras=extras, processed=processed
        )
        groups.completions = [conversation_text(m) for m in replies]  # the completions table shows every turn
        return groups

    def _custom_rollout_groups(self, columns: dict[str, list]) -> SampledGroups:
        """The user's `rollout_func(prompts, trainer)`: one completion per prompt (each prompt repeated
        `num_generations` times), its extra keys handed to reward functions as columns."""
        ids = columns.pop("input_ids")
        prompts = columns.pop("prompt", None)
        if prompts is None:  # a pre-tokenised dataset: its prompts as text
            prompts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
        if getattr(self.args, "use_vllm", False):
            self._sampler()  # an engine rollout_func may sample with: asking for it pushes the new weights
        output = check_rollout_output(self.agents.rollout_func(prompts, self), len(prompts))
        extra = {k: list(v) for k, v in output.items() if k not in (*ROLLOUT_KEYS, "env_mask")}
        mask = output.get("env_mask")
        batch = sequences_batch(
            *(list(map(list, output[k])) for k in ROLLOUT_KEYS),
            None if mask is None else [[bool(m) for m in row] for row in mask],
            self.processing_class.pad_token_id, self.accelerator.device,
        )  # fmt: skip
        return self._scored_groups(batch, prompts, {**columns, **extra})

    def _max_model_length(self) -> int | None:
        """The most tokens one sequence may hold: the inference engine's limit when one is set, else the
        policy's context."""
        if getattr(self.args, "use_vllm", False) and self.args.vllm_max_model_length:
            return self.args.vllm_max_model_length
        return context_length(self.accelerator.unwrap_model(self.model))

    def _agent_metrics(self) -> dict[str, float]:
        """TRL's `tools/*` metrics and ours over this generation batch's episodes, every process's."""
        if self.agents is None or not self.agents.uses_tools:
            return {}
        local = [{k: getattr(e, k) for k in EPISODE_COUNTERS} for e in self._episodes]
        return episode_metrics([SimpleNamespace(**counters) for counters in gather_object(local)])
