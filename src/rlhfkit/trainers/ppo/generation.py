"""`PPOTrainer.generate`: batched, left-padded sampling of responses to the user's queries.

The queries are checked and moved to the trainer's device, split into groups (one per `length_sampler`
draw, as in TRL), and each group is sampled by the configured generation backend. When `step()` can reuse
what sampling computed (`sampling_cache.reuse_is_exact`), the old logprobs and values of every sampled
token are recorded in `trainer.rollouts` on the way. An inference engine (use_vllm) returns no values (no
hidden states), so then nothing is recorded and `step()` computes logprobs and values with a forward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from rlhfkit.rollout import SamplingParams, eval_mode, make_generation_backend, pad_left
from rlhfkit.rollout.backends import ENGINE_BACKENDS
from rlhfkit.rollout.host_memory import fix_mmap_threshold, release_free_heap
from rlhfkit.trainers.common.engine_sync import engine_options, sync_engine
from rlhfkit.trainers.common.sharding import sharded_generation_context
from rlhfkit.trainers.ppo.inputs import as_token_tensor, generation_config_from_kwargs
from rlhfkit.trainers.ppo.sampling_cache import reuse_is_exact


def _query_list(query_tensor: Any) -> tuple[list[torch.Tensor], bool]:
    """(the queries as a list of 1-D token tensors, whether a single 1-D query was given)."""
    if isinstance(query_tensor, torch.Tensor) and query_tensor.dim() == 1:
        return [as_token_tensor(query_tensor, "query_tensor")], True
    if isinstance(query_tensor, list | tuple) and len(query_tensor) > 0:
        return [as_token_tensor(q, f"query_tensor[{i}]") for i, q in enumerate(query_tensor)], False
    raise TypeError("query_tensor must be a 1-D tensor or a non-empty list of 1-D tensors of token ids")


def _pad_and_stop_ids(generation_kwargs: dict[str, Any], tokenizer: Any) -> tuple[int, int | None]:
    """(pad id, stop id): popped from `generation_kwargs`, else the tokenizer's; pad falls back to eos."""
    pad_id = generation_kwargs.pop("pad_token_id", None)
    pad_id = pad_id if pad_id is not None else tokenizer.pad_token_id
    stop_id = generation_kwargs.pop("eos_token_id", None)
    stop_id = stop_id if stop_id is not None else tokenizer.eos_token_id
    pad_id = pad_id if pad_id is not None else stop_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; pass pad_token_id=")
    return pad_id, stop_id


def _query_groups(n_queries: int, batch_size: int, length_sampler: Any) -> list[tuple[int, int]]:
    """(start, end) of each group sampled with one `max_new_tokens`.

    `length_sampler` draws one max_new_tokens per `batch_size` queries (TRL): one request per such group;
    without it, all the queries go in one request.
    """
    step = batch_size if length_sampler is not None else n_queries
    return [(start, min(start + step, n_queries)) for start in range(0, n_queries, step)]


class GenerationMethods:
    """Mixed into `PPOTrainer`; relies on its `config`, `accelerator`, `policy`, `tokenizer`, `rollouts`."""

    @torch.no_grad()
    def generate(
        self,
        query_tensor: torch.Tensor | list[torch.Tensor],
        length_sampler: Any = None,
        batch_size: int = 4,
        return_prompt: bool = True,
        generate_ref_response: bool = False,
        **generation_kwargs: Any,
    ) -> Any:
        """Sample responses: batched, left-padded, each cut after its first EOS.

        A list of 1-D queries gives a list of 1-D responses (padding removed); a single 1-D query gives
        a (1, L) tensor. `return_prompt=True` (the documented default) prepends each query (decoder-only
        models); pass False to get only the new tokens, which is what `step()` expects as responses.
        `length_sampler()` draws `max_new_tokens` per batch of `batch_size` queries. With
        `generate_ref_response=True`, returns `(responses, ref_responses)`.
        """
        queries, single = _query_list(query_tensor)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        generation_kwargs = dict(generation_kwargs)
        pad_id, stop_id = _pad_and_stop_ids(generation_kwargs, self.tokenizer)
        config = generation_config_from_kwargs(
            getattr(self.policy, "generation_config", None), generation_kwargs
        )
        params = SamplingParams.from_generation_config(config, None if stop_id is None else [stop_id])
        queries = [q.to(self.current_device) for q in queries]
        responses, ref_responses = [], []
        for start, end in _query_groups(len(queries), batch_size, length_sampler):
            if length_sampler is not None:
                params = dataclasses.replace(params, max_new_tokens=int(length_sampler()))
            out, ref_out = self._sample(queries[start:end], pad_id, params, batch_size, generate_ref_response)
            responses += out
            ref_responses += ref_out
        if return_prompt and not self.is_encoder_decoder:
            responses = [torch.cat([q, r]) for q, r in zip(queries, responses)]
            ref_responses = [torch.cat([q, r]) for q, r in zip(queries, ref_responses)]
        if single:
            responses = responses[0].unsqueeze(0)
            ref_responses = ref_responses[0].unsqueeze(0) if generate_ref_response else ref_responses
        return (responses, ref_responses) if generate_ref_response else responses

    def _sample(self, queries, pad_id, params, chunk_size, with_reference) -> tuple[list, list]:
        """Responses (1-D, no padding, no prompt) of the policy and, if asked, of the reference."""
        ids, mask = pad_left(queries, pad_id)
        record = self._records_rollouts()
        fix_mmap_threshold()  # freed (batch, vocab) sampling blocks go back to the OS

        def gathered():  # ZeRO-3 shards the weights: gather them once per call rather than once per token
            return sharded_generation_context(
                self.accelerator, self.policy, self.config.ds3_gather_for_generation
            )

        engine, options = self.config.generation_engine()
        if engine in ENGINE_BACKENDS:
            policy = self._engine_sampler()
            engine, options = self.config.generation_backend, {}  # the reference samples in-process
        else:
            policy = make_generation_backend(
                self.policy,
                pad_id,
                engine=engine,
                chunk_size=chunk_size,
                weights_context=gathered,
                value_head=self.policy.v_head if record else None,
                options=options,
            )
        # logprobs at temperature 1, as step() scores them
        out = policy.generate(ids, mask, params, logprob_temperature=1.0 if record else None)
        release_free_heap(self.policy, len(queries))
        responses = [r[m] for r, m in zip(out.responses, out.response_mask)]
        if record:
            self.rollouts.add(queries, responses, out.logprobs, out.values, self.policy_version)
        if not with_reference:
            return responses, []
        with self._reference() as ref, eval_mode(self.policy):
            reference = make_generation_backend(
                ref, pad_id, engine=engine, chunk_size=chunk_size, weights_context=gathered
            )
            ref_out = reference.generate(ids, mask, params)
        return responses, [r[m] for r, m in zip(ref_out.responses, ref_out.response_mask)]

    def _engine_sampler(self) -> Any:
        """The inference engine's backend (use_vllm): connected and checked on the first call, which the
        trainer's construction makes, then given the policy's weights after every optimizer step."""
        if getattr(self, "_engine", None) is None:
            engine, options = self.config.generation_engine()
            options = engine_options(engine, options, self.accelerator, self.tokenizer)
            pad_id = self.tokenizer.pad_token_id
            self._engine = make_generation_backend(
                self.policy,
                self.tokenizer.eos_token_id if pad_id is None else pad_id,
                engine=engine,
                weights_context=lambda: sharded_generation_context(
                    self.accelerator, self.policy, self.config.ds3_gather_for_generation
                ),
                options=options,
            )
            # the engine serves the checkpoint on disk, not necessarily the policy
            self._engine_version = None
        if self._engine_version != self.policy_version:
            sync_engine(self._engine, self.policy, self.accelerator)
            self._engine_version = self.policy_version
        return self._engine

    def _records_rollouts(self) -> bool:
        """Whether generate() keeps logprobs and values for step() (`sampling_cache.reuse_is_exact`)."""
        return reuse_is_exact(self.config, self.accelerator, self.policy, self.is_encoder_decoder)
