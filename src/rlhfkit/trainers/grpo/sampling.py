"""Steps 1-2 of GRPO's generation batch: prompts in, groups of completions out, decoded and scored.

One round takes the next batch of prompts, samples `num_generations` completions of each with the trainer's
generation backend (their logprobs streamed out of sampling) and scores them with every reward source; with
`dynamic_sampling` (DAPO) rounds repeat until the batch holds enough groups whose rewards differ.
"""

from __future__ import annotations

import torch

from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.guards import any_across_ranks
from rlhfkit.trainers.grpo.groups import SampledGroups, fill_batch


class SamplingMethods:
    """Mixed into `GRPOTrainer`; relies on its `args`, `prompts`, `scorer`, `processing_class`, `accelerator`,
    `agents`, `_sampler`, `_pad_prompts`, `_decode`, `_policy_logprobs_now`, `_reward_extras` and (multi-turn)
    `_agent_groups`."""

    def _sample_batch(self) -> tuple[SampledGroups, dict[str, float]]:
        """One generation batch of scored groups; with dynamic sampling, only informative groups (DAPO)."""
        args = self.args
        if not args.dynamic_sampling:
            return self._sample_groups(), {}
        return fill_batch(
            self._sample_groups,
            args.local_prompts_per_generation,
            args.num_generations,
            args.max_sampling_rounds,
            self.processing_class.pad_token_id,
            any_process=lambda short: any_across_ranks(short, self.accelerator),
        )

    def _sample_groups(self) -> SampledGroups:
        """One round: the next batch of prompts, `num_generations` completions each, decoded and scored."""
        rows = self.prompts.rows(self._prompt_batches)
        self._prompt_batches += 1
        return self._score_groups(rows, self.args.num_generations)

    def _score_groups(self, rows: dict[str, list], num_generations: int) -> SampledGroups:
        """`num_generations` completions of each prompt of `rows` (dataset columns), decoded and scored."""
        if self.agents is not None:  # multi-turn: tool-calling episodes or the user's rollout_func
            return self._agent_groups(rows, num_generations)
        args = self.args
        repeat = [i for i in range(len(rows["input_ids"])) for _ in range(num_generations)]
        query_ids, query_mask = self._pad_prompts([rows["input_ids"][i] for i in repeat])
        # beam search (num_beams > 1 in generation_kwargs) streams no token logprobs: one forward pass after
        beams = int(self.sampling_params.extra.get("num_beams") or 1) > 1
        temperature = None if beams else args.temperature
        out = self._sampler().generate(
            query_ids, query_mask, self.sampling_params, logprob_temperature=temperature
        )
        batch = RolloutBatch(
            query_ids, query_mask, out.responses, out.response_mask, out.response_mask, logprobs=out.logprobs
        )
        batch = batch.trimmed()
        if beams:
            batch = batch.replace(logprobs=self._policy_logprobs_now(batch))
        prompts = [rows["prompt"][i] for i in repeat] if "prompt" in rows else None
        columns = {k: [v[i] for i in repeat] for k, v in rows.items() if k not in ("prompt", "input_ids")}
        return self._scored_groups(batch, prompts, columns)

    def _scored_groups(
        self,
        batch: RolloutBatch,
        prompts: list | None,
        columns: dict[str, list],
        replies: list | None = None,
        extras: dict | None = None,
    ) -> SampledGroups:
        """`batch` scored by every reward source. Reward functions get `prompts` (None: the decoded queries),
        `completions` (`replies`, else the decoded responses, as one assistant message each for chat
        prompts), `completion_ids`, `columns` and each of `extras` they take."""
        if self.args.mask_truncated_completions:  # DAPO: a cut-off completion is no evidence either way
            batch = batch.replace(loss_mask=batch.loss_mask & ~self._truncated(batch)[:, None])
        prompt_texts, completions = self._decode(batch.query_ids, batch.responses, batch.response_mask)
        prompts = prompt_texts if prompts is None else prompts
        if replies is None:
            conversational = bool(prompts) and isinstance(prompts[0], list)
            replies = (
                [[{"role": "assistant", "content": c}] for c in completions]
                if conversational
                else completions
            )
        kwargs = dict(columns, prompts=prompts, completions=replies)
        kwargs["completion_ids"] = [
            r[m].tolist() for r, m in zip(batch.responses, batch.response_mask.bool())
        ]
        scored = self.scorer(
            *self._rollout_tensors(batch),
            prompt_texts,
            completions,
            kwargs,
            function_extras={**self._reward_extras(), **(extras or {})},
        )
        scores, per_source = scored
        return SampledGroups(batch.replace(scores=scores), per_source, scored.applies, prompts, completions)

    @staticmethod
    def _rollout_tensors(batch: RolloutBatch) -> tuple[torch.Tensor, ...]:
        return batch.query_ids, batch.query_mask, batch.responses, batch.response_mask

    def _truncated(self, batch: RolloutBatch) -> torch.Tensor:
        """(N,) bool: the completion was cut at max_completion_length: its last token is not the eos token
        (a multi-turn completion holds the eos of each of its turns)."""
        eos = self.processing_class.eos_token_id
        mask = batch.response_mask.bool()
        if eos is None:
            return mask.sum(1) >= self.args.max_completion_length
        last = mask & (mask.long().cumsum(1) == mask.sum(1, keepdim=True))  # each row's last real token
        return ~((batch.responses == eos) & last).any(1)
