"""PPOTrainer: the classic generate -> score -> `step()` loop (Ziegler et al. 2019; Stiennon et al. 2020).

The user samples responses with `generate` (`generation.py`), scores them with any function or reward
model, and calls `step(queries, responses, scores)`. `step` is the numbered story of the algorithm; each
number is one call into `core`, `rollout` or `update.py`, and the rollout travels between them as a
`RolloutBatch`. TRL's finer-grained methods (`batched_forward_pass`, `compute_rewards`,
`compute_advantages`, `loss`, `train_minibatch`) stay as thin wrappers over the same functions, off the
step path.

Departures from TRL 0.7 worth knowing: position ids follow the attention mask, so logprobs do not depend on
padding or on how a batch is chunked; the old logprobs and values computed while sampling are reused when
`step()` gets exactly what `generate()` sampled; see `update.py` for the minibatch rules.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from typing import Any

import torch
from torch import nn

from rlhfkit.core.advantages import whitened_gae
from rlhfkit.core.rewards import RunningMoments, clip_tensor, compute_token_rewards, scale_scores
from rlhfkit.rollout import eval_mode
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.rollout.scoring import ForwardOutput, forward_batch, forward_response
from rlhfkit.trainers.common.guards import GracefulStop, NonFiniteGuard, any_across_ranks, loss_scaler_active
from rlhfkit.trainers.common.health import HealthMonitor, monitor_for, watch
from rlhfkit.trainers.ppo import construction
from rlhfkit.trainers.ppo import stats as ppo_stats
from rlhfkit.trainers.ppo.config import PPOConfig
from rlhfkit.trainers.ppo.generation import GenerationMethods
from rlhfkit.trainers.ppo.inputs import (
    check_step_inputs,
    check_trainer_args,
    ppo_collator,
    responses_repeat_queries,
)
from rlhfkit.trainers.ppo.sampling_cache import SamplingCache
from rlhfkit.trainers.ppo.saving import SavingMethods
from rlhfkit.trainers.ppo.tracking import TrackingMethods
from rlhfkit.trainers.ppo.trl_methods import TRLMethods
from rlhfkit.trainers.ppo.update import UpdateResult, run_ppo_epochs

logger = logging.getLogger(__name__)


class PPOTrainer(GenerationMethods, TrackingMethods, TRLMethods, SavingMethods):
    """Proximal policy optimisation for a language model with a value head.

    Args (TRL 0.x API): `config` (PPOConfig), `model` (AutoModelForCausalLMWithValueHead or
    AutoModelForSeq2SeqLMWithValueHead, optionally around a PeftModel), `ref_model` (frozen reference;
    default: a copy of `model` sharing its first `num_shared_layers` layers, or for a PEFT policy its
    frozen SFT adapter or the same model with its adapter disabled), `tokenizer`, `dataset` (turned into
    `self.dataloader`; `train_dataset` is accepted as an alias), `optimizer` (default Adam at
    `config.learning_rate`), `data_collator`, `num_shared_layers`, `lr_scheduler` (stepped once per `step()`).
    """

    def __init__(
        self,
        config: PPOConfig | None = None,
        model: nn.Module | None = None,
        ref_model: nn.Module | None = None,
        tokenizer: Any = None,
        dataset: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        data_collator: Any = None,
        num_shared_layers: int | None = None,
        lr_scheduler: Any = None,
        *,
        train_dataset: Any = None,
        processing_class: Any = None,
    ):
        from rlhfkit.models.peft_detection import is_peft_model
        from rlhfkit.models.reference import choose_reference

        tokenizer = tokenizer if tokenizer is not None else processing_class
        config, dataset = check_trainer_args(config, model, ref_model, tokenizer, dataset, train_dataset)
        self.accelerator = construction.make_accelerator(config)
        self.config, self.tokenizer = config, tokenizer
        self.is_encoder_decoder = bool(model.is_encoder_decoder)
        self.is_peft_model = is_peft_model(model)
        config.is_encoder_decoder, config.is_peft_model = self.is_encoder_decoder, self.is_peft_model
        # the reference: given, the PEFT policy's frozen SFT adapter or adapter-disabled base, or a frozen
        # (partly shared) copy; `ref_model` is None when the reference lives inside the PEFT policy
        self.reference = choose_reference(model, ref_model, num_shared_layers=num_shared_layers)
        self.ref_model = self.reference.model
        self.data_collator = data_collator if data_collator is not None else ppo_collator
        self.dataloader = (
            self.prepare_dataloader(dataset, self.data_collator) if dataset is not None else None
        )
        self._init_run_state(config)
        if optimizer is None:
            optimizer = construction.default_optimizer(model, config.learning_rate)
        self._fsdp = construction.uses_fsdp(self.accelerator)
        prepared, self.optimizer, self.dataloader, self.lr_scheduler = self.accelerator.prepare(
            model, optimizer, self.dataloader, lr_scheduler
        )
        # `model` stays the value-head wrapper itself (so trainer.model.compute_reward_score works in any
        # setting); under DDP training forwards bypass the wrapper and _optimizer_step averages gradients;
        # under FSDP the weights are sharded, so training forwards go through the prepared model
        self.model = self.accelerator.unwrap_model(prepared)
        self._train_model = prepared if self._fsdp else self.model
        self.current_device = self.accelerator.device
        self.is_distributed = self.accelerator.num_processes > 1
        if self.ref_model is not None and any(True for _ in self.ref_model.parameters()):
            self.ref_model = self.ref_model.to(self.current_device)
        construction.start_trackers(self.accelerator, config)
        if config.use_vllm:
            self._engine_sampler()  # an unreachable or mismatched engine fails here, before any step

    def _init_run_state(self, config: PPOConfig) -> None:
        """The state that `step()` moves on: KL controller, score moments, counters, guards, rollouts."""
        self.kl_ctl = construction.kl_controller(config)
        self.running = RunningMoments()
        self.current_step = 0
        # robustness: NaN/inf steps are skipped; SIGINT/SIGTERM inside `with trainer.graceful_stop:` only
        # sets a flag that a training loop polls with `trainer.should_stop()`
        self.nonfinite_guard = NonFiniteGuard(config.max_consecutive_nonfinite_steps)
        self.graceful_stop = GracefulStop()
        self.checkpoint_dir: str | None = None  # the last save_checkpoint folder
        self._warned_prompt = False
        # old logprobs and values computed while sampling, reused by step() (config.reuse_generation_outputs)
        self.rollouts = SamplingCache(capacity=4 * config.local_batch_size)
        self.policy_version = 0  # bumped by every optimizer step: recorded rollouts of older weights miss

    @property
    def policy(self) -> nn.Module:
        """The value-head model itself (outside any distributed wrapper; `self.model` is kept unwrapped)."""
        return self.model

    def _reference(self):
        """Context yielding the module that gives reference logprobs (no gradient)."""
        return self.reference(self.policy)

    def prepare_dataloader(self, dataset: Any, data_collator: Any = None) -> torch.utils.data.DataLoader:
        """A shuffled DataLoader of `config.batch_size` prompts per batch (last incomplete batch dropped)."""
        return construction.prompt_dataloader(dataset, self.config, data_collator)

    # ------------------------------------------------------------------ the step
    def step(
        self,
        queries: list[torch.Tensor],
        responses: list[torch.Tensor],
        scores: list[torch.Tensor],
        response_masks: list[torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """One PPO step on `config.batch_size` (query, response, score) triples; returns the statistics.

        queries, responses: lists of 1-D token tensors (responses without the prompt); scores: one
        number per sample (list of scalar tensors/floats, or a (B,) tensor); response_masks: optional
        lists of 0/1 tensors marking the response tokens to train on.
        """
        cfg, timing, t_start = self.config, {}, time.perf_counter()
        queries, responses, scores, response_masks = check_step_inputs(
            queries, responses, scores, response_masks, cfg.local_batch_size, self.current_device
        )
        self._warn_if_prompt_included(queries, responses)
        step_no = self.current_step + 1
        if not self.nonfinite_guard.check(
            step=step_no, accelerator=self.accelerator, scores=scores, ends_bad_run=False
        ):
            return self._skipped_step_stats()  # NaN scores would also poison the running score moments
        batch = RolloutBatch.from_sequences(queries, responses, self._pad_id(), response_masks)
        batch = batch.replace(scores=self._scale_scores(scores))

        # 1. old logprobs and values of the policy (kept from generate() when it sampled exactly these
        #    pairs), logprobs of the reference
        with ppo_stats.timed(timing, "forward_pass"):
            batch, logits, ref_logits, reused = self._score_tokens(batch, queries, responses)
        # 2. scores -> per-token rewards with the KL penalty
        with ppo_stats.timed(timing, "compute_rewards"):
            rewards, non_score_rewards, kls = self._token_rewards(batch, logits, ref_logits)
            del logits, ref_logits
        # 3. GAE and whitened advantages
        with ppo_stats.timed(timing, "compute_advantages"):
            batch = self._with_advantages(batch, rewards)
        # 4. PPO epochs over shuffled minibatches
        with ppo_stats.timed(timing, "optimize_step"):
            update = self._update(batch)
        # 5. statistics, gathered across processes; 6. KL controller and learning-rate schedule
        with ppo_stats.timed(timing, "calc_stats"):
            stats = self._step_stats(
                batch, queries, responses, scores, non_score_rewards, kls, update, reused
            )
            self._advance_schedules(stats)
        timing["time/ppo/total"] = time.perf_counter() - t_start
        stats.update({k: torch.tensor(v) for k, v in timing.items()})
        self.current_step += 1
        self._release_device_cache()
        stats = ppo_stats.stats_to_python(stats)
        stats.update(watch(self.health, stats, self.current_step, self.accelerator.is_main_process))
        return stats

    @functools.cached_property
    def health(self) -> HealthMonitor | None:
        """The health alarms of `step()` (docs/health.md); assign a `HealthMonitor` for other thresholds."""
        return (
            monitor_for("ppo", self.kl_ctl, self.config.global_batch_size)
            if self.config.health_checks
            else None
        )

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _score_tokens(self, batch: RolloutBatch, queries, responses):
        """(batch with logprobs, values, ref_logprobs; policy logits; reference logits; reused?).

        Logits are kept only for `kl_penalty='full'`; a policy pass is skipped when generate() recorded
        these pairs with the current weights.
        """
        full_kl = self.config.kl_penalty == "full"
        recorded = self._recorded_rollouts(queries, responses, batch)
        if recorded is not None:
            (logprobs, values), logits = recorded, None
        else:
            out = self._forward_batch(self.policy, batch, full_kl, with_values=True)
            logprobs, values, logits = out.logprobs, out.values, out.logits
        with self._reference() as ref:
            ref_out = self._forward_batch(ref, batch, full_kl)
        batch = batch.replace(logprobs=logprobs, values=values, ref_logprobs=ref_out.logprobs)
        return batch, logits, ref_out.logits, recorded is not None

    def _forward_batch(
        self, model, batch: RolloutBatch, return_logits: bool = False, with_values: bool = False
    ):
        """No-grad, eval-mode forward over the batch in chunks of `mini_batch_size` rows."""
        with eval_mode(model), eval_mode(self.policy):
            return forward_batch(
                model,
                batch,
                self.config.local_mini_batch_size,
                with_values=with_values,
                return_logits=return_logits,
            )

    def _token_rewards(self, batch: RolloutBatch, logits, ref_logits):
        """(rewards, non_score_rewards, kls), each (B, R): per-token rewards with the KL penalty.

        The reward of a token is -kl_coef * KL_t, plus the score on the last trained token; the logits
        are used only for `kl_penalty='full'`.
        """
        return compute_token_rewards(
            batch.scores,
            batch.logprobs,
            batch.ref_logprobs,
            batch.loss_mask,
            kl_coef=self.kl_ctl.value,
            kl_penalty=self.config.kl_penalty,
            logits=logits,
            ref_logits=ref_logits,
        )

    def _with_advantages(self, batch: RolloutBatch, rewards: torch.Tensor) -> RolloutBatch:
        """The batch with GAE advantages (whitened) and returns filled in."""
        cfg = self.config
        advantages, returns = whitened_gae(
            batch.values, rewards, batch.loss_mask, cfg.gamma, cfg.lam, whiten_rewards=cfg.whiten_rewards
        )
        return batch.replace(advantages=advantages, returns=returns)

    def _update(self, batch: RolloutBatch) -> UpdateResult:
        """The PPO epochs over a batch whose logprobs, values, advantages and returns are filled in."""
        self._train_model.train()
        return run_ppo_epochs(
            batch,
            self.config,
            forward=self._policy_forward,
            backward=self.accelerator.backward,
            optimizer_step=self._optimizer_step,
            zero_grad=self.optimizer.zero_grad,
            any_process=lambda flag: any_across_ranks(flag, self.accelerator),
        )

    def _policy_forward(self, rows: RolloutBatch) -> ForwardOutput:
        # under DDP the unwrapped policy is called directly (no DDP hooks): _optimizer_step averages
        # gradients across processes once per accumulation group, after any skipped minibatch
        inputs = (rows.query_ids, rows.query_mask, rows.responses, rows.response_mask)
        return forward_response(self._train_model, *inputs, with_values=True, with_entropy=True)

    def _step_stats(self, batch, queries, responses, raw_scores, non_score_rewards, kls, update, reused):
        cfg = self.config
        train_stats = ppo_stats.stack_stats(update.minibatch_stats)
        stats = self.record_step_stats(
            kl_coef=self.kl_ctl.value, scores=raw_scores, queries=queries, responses=responses,
            logprobs=batch.logprobs, ref_logprobs=batch.ref_logprobs, values=batch.values,
            returns=batch.returns, advantages=batch.advantages, non_score_rewards=non_score_rewards,
            kls=kls, mask=batch.loss_mask, train_stats=train_stats,
        )  # fmt: skip
        stats["ppo/skipped_minibatches"] = train_stats["policy/skipped"].sum()
        stats["ppo/early_stopped"] = torch.tensor(float(update.early_stopped))
        stats["ppo/optimizer_steps"] = torch.tensor(float(update.optimizer_steps))
        stats["ppo/skipped_nonfinite_steps"] = torch.tensor(float(self.nonfinite_guard.skipped))
        stats["ppo/reused_generation_outputs"] = torch.tensor(float(reused))
        if cfg.use_score_scaling or cfg.score_clip is not None:
            stats["ppo/mean_scores_scaled"] = batch.scores.mean()
        return self.gather_stats(stats)

    def _advance_schedules(self, stats: dict[str, Any]) -> None:
        """Move the KL controller and the learning-rate schedule on by one step.

        Records in `stats` the learning rate this step's updates used, read before the scheduler moves it.
        """
        samples = self.config.local_batch_size * self.accelerator.num_processes
        self.kl_ctl.update(float(stats["objective/kl"]), samples)
        stats["ppo/learning_rate"] = torch.tensor(float(self.optimizer.param_groups[0]["lr"]))
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def _release_device_cache(self) -> None:
        """With `config.optimize_device_cache`, free unreferenced host objects and cached device memory."""
        if self.config.optimize_device_cache:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _scale_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Running-moment score scaling / normalisation, then clipping (config.use_score_*, score_clip)."""
        cfg = self.config
        if cfg.use_score_scaling:
            all_scores = self.accelerator.gather(scores) if self.accelerator.num_processes > 1 else scores
            self.running.update(all_scores)
            scores = scale_scores(scores, self.running, shift_mean=cfg.use_score_norm)
        if cfg.score_clip is not None:
            scores = clip_tensor(scores, cfg.score_clip)
        return scores

    def _recorded_rollouts(
        self, queries, responses, batch: RolloutBatch
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Masked (B, R) old logprobs and values from generate(), if it sampled all of these pairs."""
        if not self._records_rollouts():
            return None
        return self.rollouts.take(queries, responses, batch.loss_mask, self.policy_version)

    def _warn_if_prompt_included(self, queries, responses) -> None:
        if (
            not self.is_encoder_decoder
            and not self._warned_prompt
            and responses_repeat_queries(queries, responses)
        ):
            self._warned_prompt = True
            logger.warning(
                "every response starts with its query: pass only the generated tokens to step(), "
                "e.g. from generate(..., return_prompt=False)"
            )

    # ------------------------------------------------------------------ optimizer steps and robustness
    def _optimizer_step(self) -> None:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.accelerator.num_processes > 1 and not self._fsdp:  # FSDP already reduced them in backward
            # forwards bypass the DDP wrapper (see _ppo_epochs), so average the gradients here, in one
            # collective over a flat buffer rather than one per parameter
            grads = [p.grad for p in params if p.grad is not None]
            flat = self.accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), "mean")
            for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(chunk.view_as(g))
        # fp16: the GradScaler checks the (still scaled) gradients and skips an overflowing update itself
        grads = [] if loss_scaler_active(self.accelerator) else [p.grad for p in params if p.grad is not None]
        if not self.nonfinite_guard.check(
            step=self.current_step + 1, accelerator=self.accelerator, gradients=grads
        ):
            self.optimizer.zero_grad()  # skipped: the parameters keep their last good values
            self._fail_if_exhausted()
            return
        if self.config.max_grad_norm is not None:
            self.accelerator.clip_grad_norm_(params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.policy_version += 1

    def _fail_if_exhausted(self) -> None:
        def save_last_good() -> str | None:
            if self.checkpoint_dir is not None:
                self.save_checkpoint(self.checkpoint_dir)
            return self.checkpoint_dir

        self.nonfinite_guard.fail_if_exhausted(save_last_good)

    def _skipped_step_stats(self) -> dict[str, Any]:
        """Stats of a skipped step: every statistic reads NaN, plus the skip counters."""
        self._fail_if_exhausted()
        stats = ppo_stats.SkippedStepStats()
        stats.update({"ppo/step_skipped": 1.0, **self.nonfinite_guard.stats(prefix="ppo/")})
        return stats

    def should_stop(self) -> bool:
        """True on every process once any of them got SIGINT/SIGTERM inside `with trainer.graceful_stop:`."""
        return self.graceful_stop.should_stop(self.accelerator)
