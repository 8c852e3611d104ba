"""GRPOTrainer: group relative policy optimisation (Shao et al. 2024) and its variants, TRL's interface.

One generation batch (every `updates_per_generation * num_iterations` updates):
  1. take `local_prompts_per_generation` prompts and sample `num_generations` completions of each, the group
     of a prompt on consecutive rows; the sampling logprobs are kept while generating;
  2. score them with the reward functions / models (None: that function does not apply to the row);
     with `dynamic_sampling`, drop the groups whose rewards are all equal and sample again (DAPO);
  3. reference logprobs, only when beta > 0 (with beta = 0 no reference exists at all);
  4. group-relative advantages over the batch of every process (`core.advantages.group_advantages`); a NaN
     or inf reward, a batch with no reward at all, or advantages that overflow skip every update of the
     batch, counted by the non-finite guard (`groups.reward_problem`).
One update (one optimizer step) trains on the next `per_device_train_batch_size * gradient_accumulation_steps`
rows: per micro-batch, the loss of `loss_type` (`core.policy_losses.policy_loss`) with the KL term when
beta > 0, gradients accumulated, one optimizer step.

Departures from TRL: the old logprobs of an off-policy pass (num_iterations > 1, or later updates of one
generation) are the logprobs streamed out of generation, not a second forward pass; on the first update of a
generation batch they are the detached current ones, as in TRL, and the gap between the two
(`sampling/sampling_logp_difference/*`) is logged; `sampler_correction` (TRL's IS fields) corrects it.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, ProgressCallback, Trainer

from rlhfkit.core.advantages import decoupled_group_advantages, group_advantages
from rlhfkit.core.entropy import entropy_bonus
from rlhfkit.core.kl import per_token_kl
from rlhfkit.core.masking import masked_mean
from rlhfkit.core.policy_losses import POLICY_LOSSES, policy_loss
from rlhfkit.models.reference import mix_into_reference
from rlhfkit.rewards.scoring import RewardScorer, source_name
from rlhfkit.rollout import forward_response
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.guards import RobustTrainerMixin
from rlhfkit.trainers.common.moe import attach_router_aux_loss
from rlhfkit.trainers.common.online_loop import OnlineTrainerLoop
from rlhfkit.trainers.common.progress import RichProgressCallback
from rlhfkit.trainers.common.trainer_setup import disable_dropout, load_policy, resolve_args, tag_model
from rlhfkit.trainers.grpo.agent_sampling import AgentSamplingMethods
from rlhfkit.trainers.grpo.agent_setup import check_agents, setup_agents, with_environment_rewards
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.entropy import EntropyControl
from rlhfkit.trainers.grpo.evaluation import EvaluationMethods
from rlhfkit.trainers.grpo.groups import (
    completion_stats,
    padded_to_multiple,
    reward_problem,
    reward_stats,
)
from rlhfkit.trainers.grpo.prompt_stream import is_stream, prompt_source, stream_preparer
from rlhfkit.trainers.grpo.reporting import ReportingMethods
from rlhfkit.trainers.grpo.sampler_correction import SamplerCorrectionMethods
from rlhfkit.trainers.grpo.sampling import SamplingMethods
from rlhfkit.trainers.grpo.setup import (
    OWNER,
    build_reference,
    cast_lm_head_to_fp32,
    default_output_dir,
    prepare_datasets,
    prepare_tokenizer,
    reward_sources,
    sampling_params,
)
from rlhfkit.trainers.grpo.trl_surface import TRLSurfaceMethods


class GRPOTrainer(
    TRLSurfaceMethods,
    EvaluationMethods,
    ReportingMethods,
    SamplerCorrectionMethods,
    AgentSamplingMethods,
    SamplingMethods,
    OnlineTrainerLoop,
    RobustTrainerMixin,
    Trainer,
):
    """Trains `model` with GRPO on `reward_funcs`; see `GRPOConfig` for every option.

    `model`: a causal LM or a local path. `reward_funcs`: a callable `(prompts, completions, **columns) ->
    list[float | None]` (every other dataset column by name, plus `completion_ids`), a sequence-classification
    model or its local path, or a list of these (weighted by `args.reward_weights`). Reward models read the
    policy's token ids unless `reward_processing_classes` gives their own tokenizer. `peft_config` wraps the
    model with PEFT; the reference is then the adapter-disabled base.

    Multi-turn rollouts (`agent_setup`, `agent_sampling`): `tools` (functions with type hints and a
    docstring the model may call), `environment_factory` (a callable making an environment, or a dict of them
    picked by the dataset's `environment` column: public methods are tools, `reset(**row)` starts each
    rollout, `get_reward()` adds a reward source named after its class) and `rollout_func(prompts, trainer)`
    (returns prompt_ids, completion_ids, logprobs, optionally env_mask and columns for reward functions).
    """

    _tag_names = ["rlhfkit", "grpo"]
    _health_metrics = "grpo"
    _summary_log = True
    _evaluates = True
    _owner, _config_class = OWNER, GRPOConfig  # a subclass trainer (RLOO's current form) names its own

    def __init__(
        self,
        model: nn.Module | str,
        reward_funcs: Any,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
        tools: list | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ) -> None:
        owner = self._owner
        args, processing_class = resolve_args(
            owner,
            self._config_class,
            default_output_dir(model, owner),
            args,
            model,
            None,
            processing_class,
            None,
        )
        self._settle(args)
        prepare_tokenizer(processing_class, args, owner)
        self.agents = setup_agents(tools, rollout_func, environment_factory, owner)
        check_agents(self.agents, processing_class, train_dataset, args, owner)
        policy = load_policy(
            model, AutoModelForCausalLM, args.from_pretrained_kwargs(), peft_config, owner, args.seed
        )
        self.reference = build_reference(policy, args, self._owner)
        if getattr(args, "cast_lm_head_to_fp32", False):
            for module in (policy, None if self.reference is None else self.reference.model):
                if module is not None:
                    cast_lm_head_to_fp32(module, self._owner)
        # an environment's get_reward is one more reward source
        funcs, classes = with_environment_rewards(reward_funcs, reward_processing_classes, self.agents)
        sources, self.reward_func_names, reward_processing_classes = reward_sources(
            funcs, args.from_pretrained_kwargs(), classes, owner
        )  # a reward model path brings its own tokenizer
        ref_model = None if self.reference is None else self.reference.model
        # dropout off: the logprobs taken while sampling must equal those of the training forward pass
        for module in (policy if args.disable_dropout else None, ref_model, *sources):
            if isinstance(module, nn.Module):
                disable_dropout(module)
        self.reward_processing_classes = reward_processing_classes  # one per source (None: none of its own)
        models = {"model": policy}
        models.update(  # the reward models that read the policy's own token ids share its context limit
            {
                f"reward model {n}": s
                for n, s, own in zip(self.reward_func_names, sources, reward_processing_classes)
                if isinstance(s, nn.Module) and own is None
            }
        )
        # the evaluation sets stay as given (`eval_dataset`); their tokenised prompts are kept apart
        train_dataset, self._eval_prompts = prepare_datasets(
            train_dataset, eval_dataset, processing_class, args, models
        )
        self._prepare_stream_rows = stream_preparer(processing_class, args, models)
        super().__init__(
            model=policy,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if ref_model is not None:
            ref_model.to(self.accelerator.device)
        attach_router_aux_loss(self, args.router_aux_loss_coef, owner)
        tag_model(self.model, self._tag_names[-1])
        self._setup_rollout(sources, self.reward_processing_classes)
        if not args.disable_tqdm:
            self.remove_callback(ProgressCallback)
            self.add_callback(RichProgressCallback())

    def _settle(self, args: Any) -> None:
        """Last adjustments of the resolved config before anything is loaded (none for GRPO)."""

    def _setup_rollout(self, sources: list, reward_processing_classes: Any) -> None:
        args, tok = self.args, self.processing_class
        weights = args.reward_weights
        if weights is not None and self.agents is not None:  # an environment's get_reward weighs 1
            weights = [*weights, *[1.0] * len(self.agents.rewards)]
        self.scorer = RewardScorer(sources, tok, reward_processing_classes, weights, self.accelerator.device)
        self._episodes: list = []  # the tool-calling episodes of the generation batch being sampled
        self._source_names = [source_name(s) for s in sources]
        # why the current generation batch must not be trained on (see `groups.reward_problem`), or None
        self._reward_problem: str | None = None
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        # the rows of each generation batch: indexed (Dataset) or read in order (IterableDataset)
        self.prompts = prompt_source(self.train_dataset, args, processes, rank, self._prepare_stream_rows)
        self.sampling_params = sampling_params(args, tok)
        self._buffer: RolloutBatch | None = None
        # what reward functions log through log_extra / log_metric, until the generation batch is done
        self._pending_reward_logs: tuple[dict, dict] = (defaultdict(list), defaultdict(list))
        self._buffer_metrics: dict[str, float] = {}
        # prompt batches drawn so far (dynamic sampling draws several per generation)
        self._prompt_batches = 0
        self._on_policy = True
        self.entropy_control = EntropyControl(args)

    # ------------------------------------------------------------------ the shared loop's hooks
    def _num_updates(self) -> int:
        args = self.args
        if args.max_steps > 0 or is_stream(self.train_dataset):  # a stream has no length: max_steps is set
            return args.max_steps
        completions = (
            args.num_train_epochs * len(self.train_dataset) * args.num_generations * args.num_iterations
        )
        per_update = self._episodes_per_update()
        return max(1, int(-(-completions // per_update)))

    def _episodes_per_update(self) -> int:
        args = self.args
        return (
            args.per_device_train_batch_size
            * args.gradient_accumulation_steps
            * self.accelerator.num_processes
        )

    def _forward_chunk_size(self) -> int:
        return self.args.per_device_train_batch_size

    def _loop_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"prompt_batches": self._prompt_batches, **self.entropy_control.state()}
        if self.state.global_step % self._cycle() and self._buffer is not None:  # resumed mid-way through it
            # cloned: no shared storage
            state["buffer"] = {k: v.clone() for k, v in vars(self._buffer).items() if v is not None}
            state["buffer_metrics"] = self._buffer_metrics
            state["reward_problem"] = self._reward_problem
        return state

    def _load_loop_state(self, state: dict[str, Any]) -> None:
        self._prompt_batches = int(state["prompt_batches"])
        if "entropy_coef" in state and self.entropy_control.adaptive:  # a fixed coefficient is the config's
            self.entropy_control.load(state)
        if "buffer" in state:
            self._buffer = RolloutBatch(**state["buffer"]).to(self.accelerator.device)
            self._buffer_metrics = dict(state["buffer_metrics"])
            self._reward_problem = state.get("reward_problem")

    def _cycle(self) -> int:
        """Updates between two generation batches."""
        return self.args.updates_per_generation * self.args.num_iterations

    # ------------------------------------------------------------------ steps 1-4
    def _rollout(self, update: int) -> tuple[RolloutBatch, dict[str, float]]:
        args = self.args
        position = update % self._cycle()
        if position == 0 or self._buffer is None:
            self._buffer, self._buffer_metrics = self._generate()
        # the first update of a generation batch is on-policy: its old logprobs are the current ones
        self._on_policy = position == 0
        size = args.per_device_train_batch_size * args.gradient_accumulation_steps
        start = (position % args.updates_per_generation) * size
        return self._buffer[start : start + size], dict(self._buffer_metrics)

    @torch.no_grad()
    def _generate(self) -> tuple[RolloutBatch, dict[str, float]]:
        args = self.args
        # 1-2. groups of completions, scored
        self._episodes.clear()
        groups, metrics = self._sample_batch()
        extra_columns, reward_metrics = self._flush_reward_logs()
        batch = padded_to_multiple(groups.batch, args.pad_to_multiple_of, self.processing_class.pad_token_id)
        batch, correction_metrics = self._with_old_logprobs(batch)  # the sampler correction, when on
        # 3. reference logprobs, only with a KL term
        if self.reference is not None:
            batch = batch.replace(ref_logprobs=self._reference_logprobs(batch))
        # 4. advantages over the whole generation batch (all processes), then this process's rows
        gather = self.accelerator.gather
        scores, per_source = gather(batch.scores), gather(groups.per_source.T.contiguous()).T
        applies = gather(groups.applies.T.to(torch.uint8).contiguous()).T.bool()
        advantages, advantage_metrics = self._advantages(batch, scores, per_source)  # per_source: NaN = n/a
        # NaN/inf rewards, no reward at all, overflowing advantages: every update of this batch is skipped
        self._reward_problem = reward_problem(per_source, applies, advantages, self._source_names)
        rank, n = self.accelerator.process_index, len(batch)
        batch = batch.replace(advantages=advantages[rank * n : (rank + 1) * n].to(batch.scores.device))
        stats = reward_stats(scores, per_source, self.reward_func_names, args.num_generations)
        # lengths count sampled tokens only: tool results inserted into a completion are not generated (TRL)
        lengths, truncated = batch.model_tokens().sum(1), self._truncated(batch)
        stats.update(completion_stats(gather(lengths), gather(truncated)))
        if metrics:
            counts = gather(torch.tensor(list(metrics.values()), device=lengths.device)[None])
            metrics = {
                "sampling/dropped_groups": counts[:, 0].sum().item(),
                "sampling/rounds": counts[:, 1].max().item(),
            }
        metrics.update({k: v.item() for k, v in stats.items()})
        metrics.update(advantage_metrics, **correction_metrics)
        metrics.update(reward_metrics, **self._agent_metrics())
        tokens = gather((batch.query_mask.sum() + batch.model_tokens().sum())[None]).sum().item()
        self.state.num_input_tokens_seen += int(tokens)  # prompt + completion tokens, all processes (TRL)
        metrics["num_tokens"] = self.state.num_input_tokens_seen
        self._log_completions(groups, batch, extra_columns)
        return batch, metrics

    def _advantages(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        per_source: torch.Tensor | None = None,
        group_size: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(advantages of every process's rows, extra metrics) from the gathered weighted `scores` (N,), or
        from each source's rewards `per_source` (S, N; NaN: does not apply) with "normalize_then_sum";
        `group_size` defaults to num_generations (evaluation's is num_generations_eval)."""
        args, group_size = self.args, group_size or self.args.num_generations
        if args.multi_objective_aggregation == "normalize_then_sum":
            weights = torch.tensor(self.scorer.weights, device=per_source.device)
            return decoupled_group_advantages(per_source, weights, group_size), {}
        return group_advantages(scores, group_size, scale_rewards=args.scale_rewards), {}

    # ------------------------------------------------------------------ the update
    def _optimize(self, model: nn.Module, batch: RolloutBatch) -> dict[str, float]:
        args = self.args
        processes = self.accelerator.num_processes
        # the loss is normalised over the whole step on every process: global counts / processes, so that
        # the gradients averaged by DDP equal those of one process holding every row
        # (at least one token: with every completion masked the loss is 0, not 0/0)
        step_tokens = max(self.accelerator.gather(batch.loss_mask.sum()[None]).sum().item(), 1.0) / processes
        stats = defaultdict(list)
        micro_batches = list(batch.minibatches(args.per_device_train_batch_size))
        for i, (_, rows) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(model):
                for key, value in self._micro_step(model, rows, step_tokens, len(batch)).items():
                    stats[key].append(value)
        if args.max_grad_norm:
            self.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        if self._reward_problem is None:
            self.guarded_optimizer_step(model)  # skipped if non-finite
        else:  # counted and warned about like a non-finite loss (NonFiniteError after too many in a row)
            self.check_step_is_finite(model, problem=self._reward_problem)
        self.optimizer.zero_grad()
        if args.sync_ref_model and (self.state.global_step + 1) % args.ref_model_sync_steps == 0:
            self._sync_reference()
        metrics = self._reduce(stats)
        if self.entropy_control.enabled:  # the step's entropy sets the next step's coefficient
            device = self.accelerator.device
            reduce_sum = lambda t: self.accelerator.reduce(t.to(device), reduction="sum").cpu()  # noqa: E731
            metrics["entropy_coef"] = self.entropy_control.end_step(reduce_sum)
        return metrics

    def _micro_step(
        self, model: nn.Module, rows: RolloutBatch, step_tokens: float, step_sequences: int
    ) -> dict:
        loss, stats = self._loss(model, rows, step_tokens, step_sequences)
        self.accelerator.backward(loss)
        return stats

    def _loss(
        self,
        model: nn.Module,
        rows: RolloutBatch,
        step_tokens: float,
        step_sequences: int,
        training: bool = True,
    ) -> tuple[torch.Tensor, dict]:
        """The loss of `rows` (their share of a step of `step_tokens` / `step_sequences`) and its statistics;
        `training=False` (evaluation) leaves the entropy controller alone."""
        args, mask, entropy = self.args, rows.loss_mask, self.entropy_control
        out, old, router_losses = self._policy_logprobs(model, rows, entropy_grad=entropy.enabled)
        kl = None
        if args.beta > 0:
            sampling = old if args.use_bias_correction_kl else None
            kl = per_token_kl(out.logprobs, rows.ref_logprobs, "k3", sampling_logprobs=sampling)
        # the top quantile of every process's trained tokens, as TRL
        quantile = args.top_entropy_quantile
        keep = self.get_high_entropy_mask(out.entropy, mask, 1.0 - quantile) if quantile < 1 else None
        result = policy_loss(
            args.loss_type,
            out.logprobs,
            old,
            rows.advantages,
            mask,
            epsilon_low=args.epsilon,
            epsilon_high=args.epsilon_high,
            delta=args.delta,
            importance_sampling_level=args.importance_sampling_level,
            per_token_kl=kl,
            beta=args.beta,
            max_completion_length=args.max_completion_length,
            step_tokens=step_tokens,
            step_sequences=step_sequences,
            entropy_mask=keep,
            sequence_mask=self._off_policy_mask(out.logprobs, rows),
            loss_options={name: getattr(args, name) for name in POLICY_LOSSES[args.loss_type].options},
            sampler_weights=self._sampler_weights(rows),
        )
        loss, stats = result.loss, {}
        if entropy.enabled:  # the mean entropy of the trained tokens, this micro-batch's share of the step
            trained = mask.bool() if keep is None else mask.bool() & keep
            share = len(rows) / step_sequences
            loss = loss + entropy_bonus(out.entropy, trained, entropy.applied()) * share
            if training:
                entropy.observe(out.entropy, trained)
            stats["policy_loss"] = result.loss.detach()
        # a mixture-of-experts model's balancing loss, this micro-batch's share of the step's mean
        loss, router_metrics = self.router_aux.add(loss, router_losses, scale=len(rows) / step_sequences)
        stats = {
            **stats,
            **router_metrics,
            "loss": loss.detach(),
            "entropy": masked_mean(out.entropy.detach(), rows.model_tokens()),  # every sampled token (TRL)
            "clip_ratio/low_mean": result.clip_ratio_low,
            "clip_ratio/high_mean": result.clip_ratio_high,
            "clip_ratio/region_mean": result.clip_ratio_region,
        }
        if result.kl_mean is not None:
            stats["kl"] = result.kl_mean
        return loss, {**stats, **self._sampling_gap(out.logprobs, rows)}

    def _policy_logprobs(
        self, model: nn.Module, rows: RolloutBatch, entropy_grad: bool = False
    ) -> tuple[Any, torch.Tensor, list[torch.Tensor]]:
        """The training forward over `rows` (logprobs and entropy, differentiable with `entropy_grad`), the
        old logprobs (the detached current ones on the first update of a generation batch, else
        `_old_logprobs`) and a mixture-of-experts model's load-balancing losses (`common.moe`)."""
        with self.accelerator.autocast(), self.router_aux.collect(model) as router_losses:
            out = forward_response(
                model, *self._rollout_tensors(rows), temperature=self.args.temperature, with_entropy=True,
                entropy_grad=entropy_grad,
            )  # fmt: skip
        return out, out.logprobs.detach() if self._on_policy else self._old_logprobs(rows), router_losses

    @torch.no_grad()
    def _sync_reference(self) -> None:
        """TR-DPO: ref <- alpha * policy + (1 - alpha) * ref, parameter by parameter."""
        policy = self.accelerator.unwrap_model(self.model)
        mix_into_reference(self.reference.model, policy, self.args.ref_model_mixup_alpha)
