"""PPOTrainer: the classic generate -> score -> `step()` loop (Ziegler et al. 2019; Stiennon et al. 2020).

The user samples responses with `generate`, scores them with any function or reward model, and calls
`step(queries, responses, scores)`. A step is a numbered story, each part one call into `rlhfkit.core`:
1. forward: old logprobs and values of the policy, reference logprobs; 2. scores -> per-token
KL-shaped rewards; 3. GAE and whitened advantages; 4. `ppo_epochs` passes of clipped policy/value
updates over shuffled minibatches; 5. KL-coefficient update; 6. statistics.

Departures from TRL 0.7 worth knowing: position ids follow the attention mask, so logprobs do not depend on
padding or on how a batch is chunked; a minibatch skipped by `ratio_threshold` gets no backward and no
optimizer step; losses are normalised by the real tokens of the whole accumulation group, so
`mini_batch_size=8` x 1 and `1` x `gradient_accumulation_steps=8` give the same update.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhfkit.core.advantages import compute_gae
from rlhfkit.core.kl import AdaptiveKLController, FixedKLController
from rlhfkit.core.losses import ppo_policy_loss, ppo_value_loss
from rlhfkit.core.masking import masked_whiten
from rlhfkit.core.rewards import RunningMoments, clip_tensor, compute_token_rewards, scale_scores
from rlhfkit.rollout import eval_mode, forward_response, generate_responses, pad_left
from rlhfkit.trainers import ppo_checkpoint, ppo_stats
from rlhfkit.trainers.common import fused_optimizer_kwargs, zero3_generation_context
from rlhfkit.trainers.guards import GracefulStop, NonFiniteGuard, loss_scaler_active
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.ppo_inputs import (
    as_token_tensor,
    check_step_inputs,
    generation_config_from_kwargs,
    pad_columns_to,
    pad_step_batch,
    ppo_collator,
    responses_repeat_queries,
)
from rlhfkit.trainers.ppo_rollouts import RolloutRecord

logger = logging.getLogger(__name__)


class PPOTrainer:
    """Proximal policy optimisation for a language model with a value head.

    Args (seed 001/002 API): `config` (PPOConfig), `model` (AutoModelForCausalLMWithValueHead or
    AutoModelForSeq2SeqLMWithValueHead, optionally around a PeftModel), `ref_model` (frozen reference;
    default: a copy of `model` sharing its first `num_shared_layers` layers, or for a PEFT policy the
    same model with its adapter disabled), `tokenizer`, `dataset` (turned into `self.dataloader`;
    `train_dataset` is accepted as an alias), `optimizer` (default Adam at `config.learning_rate`),
    `data_collator`, `num_shared_layers`, `lr_scheduler` (stepped once per `step()`).
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
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, ProjectConfiguration, set_seed

        from rlhfkit.models.adapters import peft_model_of
        from rlhfkit.models.reference import create_reference_model
        from rlhfkit.models.value_head import PreTrainedModelWrapper

        config = PPOConfig() if config is None else config
        if not isinstance(config, PPOConfig):
            raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
        if not isinstance(model, PreTrainedModelWrapper):
            raise TypeError(
                "model must be a model with a value head (AutoModelForCausalLMWithValueHead or "
                f"AutoModelForSeq2SeqLMWithValueHead), got {type(model).__name__}; load it with "
                "AutoModelForCausalLMWithValueHead.from_pretrained(path)"
            )
        if ref_model is not None and num_shared_layers is not None:
            raise ValueError("num_shared_layers applies only when ref_model is None (the trainer builds the reference)")
        if ref_model is not None and not isinstance(ref_model, nn.Module):
            raise TypeError(f"ref_model must be a torch.nn.Module or None, got {type(ref_model).__name__}")
        tokenizer = tokenizer if tokenizer is not None else processing_class
        if tokenizer is None or not hasattr(tokenizer, "pad_token_id"):
            raise TypeError("tokenizer must be a transformers tokenizer (PreTrainedTokenizerBase)")
        if dataset is not None and train_dataset is not None:
            raise ValueError("pass the prompts as dataset= or train_dataset=, not both")
        dataset = dataset if dataset is not None else train_dataset

        self.accelerator = Accelerator(
            log_with=config.log_with,
            project_config=ProjectConfiguration(**self._project_kwargs(config)),
            **config.accelerator_kwargs,
        )
        config._derive_sizes(self.accelerator.num_processes)
        set_seed(config.seed, device_specific=True)
        self.config = config
        self.tokenizer = tokenizer
        self.is_encoder_decoder = bool(model.is_encoder_decoder)
        self.is_peft_model = peft_model_of(model) is not None
        config.is_encoder_decoder, config.is_peft_model = self.is_encoder_decoder, self.is_peft_model

        # the reference: given, or the adapter-disabled PEFT model, or a frozen (partly shared) copy
        if ref_model is None and not self.is_peft_model:
            ref_model = create_reference_model(model, num_shared_layers=num_shared_layers)
        elif ref_model is None and num_shared_layers is not None:
            logger.warning("num_shared_layers is ignored for a PEFT policy: its reference shares every base weight")
        self.ref_model = ref_model

        self.data_collator = data_collator if data_collator is not None else ppo_collator
        self.dataloader = self.prepare_dataloader(dataset, self.data_collator) if dataset is not None else None
        if optimizer is None:
            trainable = [p for p in model.parameters() if p.requires_grad]
            if not trainable:
                raise ValueError("the model has no trainable parameters (requires_grad=True)")
            optimizer = torch.optim.Adam(trainable, lr=config.learning_rate, **fused_optimizer_kwargs(trainable))
        self.kl_ctl = (
            AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
            if config.adap_kl_ctrl
            else FixedKLController(config.init_kl_coef)
        )
        self.running = RunningMoments()
        self.current_step = 0
        # robustness: NaN/inf steps are skipped; SIGINT/SIGTERM inside `with trainer.graceful_stop:` only
        # sets a flag that a training loop polls with `trainer.should_stop()`
        self.nonfinite_guard = NonFiniteGuard(config.max_consecutive_nonfinite_steps)
        self.graceful_stop = GracefulStop()
        self.checkpoint_dir: str | None = None  # the last save_checkpoint folder
        self._warned_prompt = False
        # old logprobs and values computed while sampling, reused by step() (config.reuse_generation_outputs)
        self.rollouts = RolloutRecord(capacity=4 * config.batch_size)
        self.policy_version = 0  # bumped by every optimizer step: recorded rollouts of older weights miss

        self._fsdp = self.accelerator.distributed_type == DistributedType.FSDP
        if self._fsdp and not self.accelerator.is_fsdp2:  # generation and rollout forwards need FSDP2's modules
            raise ValueError("PPOTrainer under FSDP needs FSDP2: set fsdp_version: 2 in the accelerate config")
        prepared, self.optimizer, self.dataloader, self.lr_scheduler = self.accelerator.prepare(
            model, optimizer, self.dataloader, lr_scheduler
        )
        # `model` stays the value-head wrapper itself (so trainer.model.compute_reward_score works in any
        # setting); forwards bypass a DDP wrapper and _optimizer_step averages gradients instead. Under FSDP
        # the weights are sharded: training forwards go through the prepared model, which gathers them
        self.model = self.accelerator.unwrap_model(prepared)
        self._train_model = prepared if self._fsdp else self.model
        self.current_device = self.accelerator.device
        self.is_distributed = self.accelerator.num_processes > 1
        if self.ref_model is not None and any(True for _ in self.ref_model.parameters()):
            self.ref_model = self.ref_model.to(self.current_device)
        if config.log_with is not None:
            self.accelerator.init_trackers(
                config.tracker_project_name,
                config=ppo_stats.flat_hparams(config.to_dict()),
                init_kwargs=config.tracker_kwargs,
            )

    # ------------------------------------------------------------------ set-up helpers
    @staticmethod
    def _project_kwargs(config: PPOConfig) -> dict[str, Any]:
        kwargs = dict(config.project_kwargs)
        if config.log_with is not None and "logging_dir" not in kwargs and "project_dir" not in kwargs:
            kwargs["project_dir"] = "runs"  # TensorBoard needs a folder; say where it went
            logger.info("PPOTrainer: tracker logs go to ./runs (set project_kwargs={'logging_dir': ...})")
        return kwargs

    @property
    def policy(self) -> nn.Module:
        """The value-head model itself (outside any distributed wrapper; `self.model` is kept unwrapped)."""
        return self.model

    def _reference(self):
        """Context yielding the module that gives reference logprobs (no gradient)."""
        from rlhfkit.models.adapters import reference_context

        return reference_context(self.policy, self.ref_model)

    def prepare_dataloader(self, dataset: Any, data_collator: Any = None) -> torch.utils.data.DataLoader:
        """A shuffled DataLoader of `config.batch_size` prompts per batch (last incomplete batch dropped)."""
        import datasets

        if isinstance(dataset, datasets.Dataset) and self.config.remove_unused_columns:
            # the value-head forward takes input_ids/attention_mask; text columns stay for logging
            keep = {"input_ids", "attention_mask", "query", "response", "label", "labels", "prompt"}
            dataset = dataset.remove_columns([c for c in dataset.column_names if c not in keep])
        collate = data_collator if data_collator is not None else ppo_collator
        bs = self.config.batch_size
        return torch.utils.data.DataLoader(dataset, batch_size=bs, collate_fn=collate, shuffle=True, drop_last=True)

    # ------------------------------------------------------------------ generation
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
        single = isinstance(query_tensor, torch.Tensor) and query_tensor.dim() == 1
        if single:
            queries = [as_token_tensor(query_tensor, "query_tensor")]
        elif isinstance(query_tensor, list | tuple) and len(query_tensor) > 0:
            queries = [as_token_tensor(q, f"query_tensor[{i}]") for i, q in enumerate(query_tensor)]
        else:
            raise TypeError("query_tensor must be a 1-D tensor or a non-empty list of 1-D tensors of token ids")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        generation_kwargs = dict(generation_kwargs)
        pad_id = generation_kwargs.pop("pad_token_id", None)
        pad_id = pad_id if pad_id is not None else self.tokenizer.pad_token_id
        stop_id = generation_kwargs.pop("eos_token_id", None)
        stop_id = stop_id if stop_id is not None else self.tokenizer.eos_token_id
        pad_id = pad_id if pad_id is not None else stop_id
        if pad_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; pass pad_token_id=")
        config = generation_config_from_kwargs(getattr(self.policy, "generation_config", None), generation_kwargs)
        record = self._records_rollouts()

        responses, ref_responses = [], []
        # ZeRO-3 shards the weights: gather them once per call rather than once per token
        with zero3_generation_context(self.accelerator, self.policy, self.config.ds3_gather_for_generation):
            for start in range(0, len(queries), batch_size):
                chunk = [q.to(self.current_device) for q in queries[start : start + batch_size]]
                if length_sampler is not None:
                    config.max_new_tokens = int(length_sampler())
                ids, mask = pad_left(chunk, pad_id)
                kwargs = dict(pad_token_id=pad_id, stop_token_id=stop_id)
                if record:  # the raw policy's logprobs (temperature 1, as step() scores) and values
                    out, out_mask, logprobs, values = generate_responses(
                        self.policy, ids, mask, config, **kwargs,
                        with_logprobs=True, logprob_temperature=1.0, value_head=self.policy.v_head,
                    )
                    new = self._unpad(chunk, out, out_mask, return_prompt=False)
                    self.rollouts.add(chunk, new, logprobs, values, self.policy_version)
                else:
                    out, out_mask = generate_responses(self.policy, ids, mask, config, **kwargs)
                responses += self._unpad(chunk, out, out_mask, return_prompt)
                if generate_ref_response:
                    with self._reference() as ref, eval_mode(self.policy):
                        ref_out, ref_mask = generate_responses(ref, ids, mask, config, **kwargs)
                    ref_responses += self._unpad(chunk, ref_out, ref_mask, return_prompt)
        if single:
            responses = responses[0].unsqueeze(0)
            ref_responses = ref_responses[0].unsqueeze(0) if generate_ref_response else ref_responses
        return (responses, ref_responses) if generate_ref_response else responses

    def _records_rollouts(self) -> bool:
        """Whether generate() keeps logprobs and values for step(): decoder-only, no full-logit KL, float32.

        In bf16/fp16 the cached decoding path and a full forward round differently (and generation runs
        outside accelerate's autocast), so the PPO ratio would start away from 1: recompute there instead.
        """
        cfg = self.config
        float32 = self.accelerator.mixed_precision == "no" and all(
            p.dtype == torch.float32 for p in self.policy.parameters() if p.is_floating_point()
        )
        return cfg.reuse_generation_outputs and not self.is_encoder_decoder and cfg.kl_penalty != "full" and float32

    def _unpad(self, queries, responses, response_mask, return_prompt) -> list[torch.Tensor]:
        rows = [r[m] for r, m in zip(responses, response_mask)]
        if return_prompt and not self.is_encoder_decoder:
            rows = [torch.cat([q, r]) for q, r in zip(queries, rows)]
        return rows

    # ------------------------------------------------------------------ forward passes
    def _pad_batch(self, queries, responses, response_masks=None) -> dict[str, torch.Tensor]:
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return pad_step_batch(queries, responses, response_masks, pad_id)

    def _forward(self, model, batch, idx=None, *, with_values=False, with_entropy=False, return_logits=False):
        """forward_response on rows `idx` of a padded batch, trimmed to the columns those rows use."""
        rows = {k: v if idx is None else v[idx] for k, v in batch.items()}
        q_start = int(rows["query_mask"].any(0).long().argmax())
        r_end = int(rows["attention"].any(0).nonzero().max()) + 1
        return forward_response(
            model,
            rows["query_ids"][:, q_start:],
            rows["query_mask"][:, q_start:],
            rows["responses"][:, :r_end],
            rows["attention"][:, :r_end],
            with_values=with_values,
            with_entropy=with_entropy,
            return_logits=return_logits,
        ), r_end

    @torch.no_grad()
    def batched_forward_pass(
        self,
        model: nn.Module,
        queries: list[torch.Tensor],
        responses: list[torch.Tensor],
        model_inputs: dict | None = None,
        return_logits: bool = False,
        response_masks: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """No-grad forward in chunks of `config.mini_batch_size`, in eval mode.

        Returns (logprobs, logits or None, values or None, mask), each (B, R) over response tokens
        (logits (B, R, V)); values are None for a model without a value head. `model_inputs` is
        accepted for TRL compatibility and ignored: the padded batch is rebuilt from the lists.
        """
        from rlhfkit.models.value_head import PreTrainedModelWrapper

        batch = self._pad_batch(queries, responses, response_masks)
        return self._batched_forward(model, batch, return_logits, isinstance(model, PreTrainedModelWrapper))

    @torch.no_grad()
    def _batched_forward(self, model, batch, return_logits=False, with_values=False):
        length = batch["responses"].shape[1]
        logprobs, logits, values = [], [], []
        n, chunk = batch["responses"].shape[0], self.config.mini_batch_size
        with eval_mode(model), eval_mode(self.policy):
            for start in range(0, n, chunk):
                idx = torch.arange(start, min(start + chunk, n), device=batch["responses"].device)
                out, _ = self._forward(model, batch, idx, with_values=with_values, return_logits=return_logits)
                logprobs.append(pad_columns_to(out.logprobs, length))
                values.append(pad_columns_to(out.values, length))
                logits.append(pad_columns_to(out.logits, length))
        cat = (lambda xs: torch.cat(xs) if xs[0] is not None else None)  # noqa: E731
        mask = batch["mask"]
        return cat(logprobs) * mask, cat(logits), (cat(values) * mask if with_values else None), mask

    # ------------------------------------------------------------------ rewards and advantages
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

    def compute_rewards(
        self,
        scores: torch.Tensor,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor,
        masks: torch.Tensor,
        logits: torch.Tensor | None = None,
        ref_logits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token rewards -kl_coef * KL_t plus the score on the last trained token.

        scores (B,); logprobs, ref_logprobs, masks (B, R); logits (B, R, V) only for kl_penalty='full'.
        Returns (rewards, non_score_rewards, kls), each (B, R).
        """
        return compute_token_rewards(
            scores, logprobs, ref_logprobs, masks, kl_coef=self.kl_ctl.value, kl_penalty=self.config.kl_penalty,
            logits=logits, ref_logits=ref_logits,
        )

    def compute_advantages(
        self, values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE over trained tokens, advantages whitened; returns (values, advantages, returns), (B, R) each."""
        if self.config.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False)
        advantages, returns = compute_gae(values, rewards, mask, self.config.gamma, self.config.lam)
        if mask.sum() >= 2:  # whitening needs a variance
            advantages = masked_whiten(advantages, mask) * mask
        return values, advantages.detach(), returns.detach()

    # ------------------------------------------------------------------ the update
    def loss(
        self,
        old_logprobs: torch.Tensor,
        values: torch.Tensor,
        logits: torch.Tensor | None,
        vpreds: torch.Tensor,
        logprobs: torch.Tensor,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped policy loss and vf_coef * clipped value loss (masked means), plus their statistics.

        All tensors (b, R); `logits` (b, R, V) or `entropy` (b, R) feed only the entropy statistic.
        """
        from rlhfkit.core.logprobs import entropy_from_logits

        policy = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, self.config.cliprange)
        value = ppo_value_loss(vpreds, values, returns, mask, self.config.cliprange_value)
        if entropy is None and logits is not None:
            with torch.no_grad():  # a statistic only: no graph through the vocabulary softmax
                entropy = entropy_from_logits(logits.detach())
        stats = ppo_stats.minibatch_loss_stats(
            pg_loss=policy.loss, vf_loss=value.loss, vf_coef=self.config.vf_coef, policy=policy, value=value,
            entropy=entropy, vpreds=vpreds, old_logprobs=old_logprobs, logprobs=logprobs,
            advantages=advantages, returns=returns, mask=mask,
        )
        return policy.loss, self.config.vf_coef * value.loss, stats

    def _any_process(self, flag: bool) -> bool:
        """True if `flag` holds on any process (so every process takes the same branch)."""
        if self.accelerator.num_processes == 1:
            return flag
        total = self.accelerator.reduce(torch.tensor(float(flag), device=self.current_device), "sum")
        return bool(total.item() > 0)

    def train_minibatch(
        self,
        old_logprobs: torch.Tensor,
        values: torch.Tensor,
        logprobs: torch.Tensor,
        logits: torch.Tensor | None,
        vpreds: torch.Tensor,
        mask: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        *,
        entropy: torch.Tensor | None = None,
        loss_weight: float | torch.Tensor = 1.0,
        optimizer_step: bool = True,
    ) -> dict[str, torch.Tensor]:
        """Backward of one minibatch's loss (scaled by `loss_weight`); optionally one optimizer step.

        A minibatch whose mean ratio exceeds `config.ratio_threshold` gets neither a backward nor an
        optimizer step; its stats carry `policy/skipped = 1`.
        """
        pg_loss, vf_loss, stats = self.loss(
            old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns, entropy=entropy
        )
        skip = self._any_process(bool(stats["policy/ratio_mean"] > self.config.ratio_threshold))
        stats["policy/skipped"] = torch.tensor(float(skip))
        if skip:
            logger.warning(
                "PPO: skipped a minibatch with mean ratio %.3g > ratio_threshold %.3g",
                float(stats["policy/ratio_mean"]), self.config.ratio_threshold,
            )
        else:
            self.accelerator.backward((pg_loss + vf_loss) * loss_weight)
            if optimizer_step:
                self._optimizer_step()
        return stats

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
        if not self.nonfinite_guard.check(step=self.current_step + 1, accelerator=self.accelerator, gradients=grads):
            self.optimizer.zero_grad()  # skipped: the parameters keep their last good values
            self._fail_if_exhausted()
            return
        if self.config.max_grad_norm is not None:
            self.accelerator.clip_grad_norm_(params, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.policy_version += 1

    def _fail_if_exhausted(self) -> None:
        if self.nonfinite_guard.exhausted:
            if self.checkpoint_dir is not None:
                self.save_checkpoint(self.checkpoint_dir)
            self.nonfinite_guard.fail(self.checkpoint_dir)

    def _skipped_step_stats(self) -> dict[str, Any]:
        """Stats of a skipped step: every statistic reads NaN, plus the skip counters."""
        self._fail_if_exhausted()
        stats = ppo_stats.SkippedStepStats()
        stats.update({"ppo/step_skipped": 1.0, **self.nonfinite_guard.stats(prefix="ppo/")})
        return stats

    def should_stop(self) -> bool:
        """True on every process once any of them got SIGINT/SIGTERM inside `with trainer.graceful_stop:`."""
        return self.graceful_stop.should_stop(self.accelerator)

    def _ppo_epochs(self, batch, old_logprobs, values, advantages, returns) -> tuple[list[dict], bool, int]:
        """`ppo_epochs` shuffled passes; one optimizer step per `backward_batch_size` samples.

        Each minibatch's loss is weighted by its share of the group's trained tokens, so the summed
        gradient is that of the token-mean loss over the whole group, however the group is split.
        """
        cfg = self.config
        policy, mask = self._train_model, batch["mask"]
        all_stats, early_stopped, optimizer_steps = [], False, 0
        policy.train()
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(cfg.batch_size).to(self.current_device)
            for g_start in range(0, cfg.batch_size, cfg.backward_batch_size):
                group = order[g_start : g_start + cfg.backward_batch_size]
                group_tokens = mask[group].sum().clamp(min=1)
                contributed = False
                for m_start in range(0, len(group), cfg.mini_batch_size):
                    idx = group[m_start : m_start + cfg.mini_batch_size]
                    # under DDP the unwrapped policy is called directly (no DDP hooks): _optimizer_step
                    # averages gradients across processes once per group, after any skipped minibatch
                    out, r_end = self._forward(policy, batch, idx, with_values=True, return_logits=True)
                    rows = [x[idx][:, :r_end] for x in (old_logprobs, values, mask, advantages, returns)]
                    mb_old_logprobs, mb_values, mb_mask, mb_advantages, mb_returns = rows
                    stats = self.train_minibatch(
                        mb_old_logprobs, mb_values, out.logprobs, out.logits, out.values, mb_mask,
                        mb_advantages, mb_returns,
                        loss_weight=mask[idx].sum() / group_tokens, optimizer_step=False,
                    )
                    all_stats.append(stats)
                    contributed = contributed or not stats["policy/skipped"].item()
                    # host syncs only where a decision needs one (they stall a GPU's queue)
                    if cfg.early_stopping and self._any_process(bool(stats["policy/policykl"] > 1.5 * cfg.target_kl)):
                        early_stopped = True  # the drifted update is dropped, not applied
                        break
                if early_stopped:
                    self.optimizer.zero_grad()
                    break
                if contributed:
                    self._optimizer_step()
                    optimizer_steps += 1
            if early_stopped:
                break
        return all_stats, early_stopped, optimizer_steps

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
            queries, responses, scores, response_masks, cfg.batch_size, self.current_device
        )
        self._warn_if_prompt_included(queries, responses)
        step_no = self.current_step + 1
        if not self.nonfinite_guard.check(step=step_no, accelerator=self.accelerator, scores=scores, ends_bad_run=False):
            return self._skipped_step_stats()  # NaN scores would also poison the running score moments
        raw_scores = scores
        scores = self._scale_scores(scores)
        batch = self._pad_batch(queries, responses, response_masks)
        mask = batch["mask"]

        # 1. forward: old logprobs and values of the policy, logprobs of the reference
        t = time.perf_counter()
        full_kl = cfg.kl_penalty == "full"
        recorded = self._recorded_rollouts(queries, responses, batch)
        if recorded is not None:  # every pair was sampled by these weights: no second policy pass
            (old_logprobs, values), logits = recorded, None
        else:
            old_logprobs, logits, values, _ = self._batched_forward(self.policy, batch, full_kl, with_values=True)
        with self._reference() as ref:
            ref_logprobs, ref_logits, _, _ = self._batched_forward(ref, batch, full_kl)
        timing["time/ppo/forward_pass"] = time.perf_counter() - t

        # 2. scores -> per-token rewards with the KL penalty
        t = time.perf_counter()
        rewards, non_score_rewards, kls = self.compute_rewards(
            scores, old_logprobs, ref_logprobs, mask, logits=logits, ref_logits=ref_logits
        )
        del logits, ref_logits
        timing["time/ppo/compute_rewards"] = time.perf_counter() - t

        # 3. GAE and whitened advantages
        t = time.perf_counter()
        values, advantages, returns = self.compute_advantages(values, rewards, mask)
        timing["time/ppo/compute_advantages"] = time.perf_counter() - t

        # 4. PPO epochs over shuffled minibatches
        t = time.perf_counter()
        minibatch_stats, early_stopped, optimizer_steps = self._ppo_epochs(
            batch, old_logprobs, values, advantages, returns
        )
        timing["time/ppo/optimize_step"] = time.perf_counter() - t

        # 5. statistics, gathered across processes; 6. KL controller update
        t = time.perf_counter()
        train_stats = ppo_stats.stack_stats(minibatch_stats)
        stats = self.record_step_stats(
            kl_coef=self.kl_ctl.value, scores=raw_scores, queries=queries, responses=responses,
            logprobs=old_logprobs, ref_logprobs=ref_logprobs, values=values, returns=returns,
            advantages=advantages, non_score_rewards=non_score_rewards, kls=kls, mask=mask,
            train_stats=train_stats,
        )
        stats["ppo/skipped_minibatches"] = train_stats["policy/skipped"].sum()
        stats["ppo/early_stopped"] = torch.tensor(float(early_stopped))
        stats["ppo/optimizer_steps"] = torch.tensor(float(optimizer_steps))
        stats["ppo/skipped_nonfinite_steps"] = torch.tensor(float(self.nonfinite_guard.skipped))
        stats["ppo/reused_generation_outputs"] = torch.tensor(float(recorded is not None))
        if cfg.use_score_scaling or cfg.score_clip is not None:
            stats["ppo/mean_scores_scaled"] = scores.mean()
        stats = self.gather_stats(stats)
        self.kl_ctl.update(float(stats["objective/kl"]), cfg.batch_size * self.accelerator.num_processes)
        # the rate this step's updates used, read before the scheduler moves it on
        stats["ppo/learning_rate"] = torch.tensor(float(self.optimizer.param_groups[0]["lr"]))
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        timing["time/ppo/calc_stats"] = time.perf_counter() - t
        timing["time/ppo/total"] = time.perf_counter() - t_start
        stats.update({k: torch.tensor(v) for k, v in timing.items()})
        self.current_step += 1
        if cfg.optimize_device_cache:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return ppo_stats.stats_to_python(stats)

    def _recorded_rollouts(self, queries, responses, batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Masked (B, R) old logprobs and values from generate(), if it sampled all of these pairs."""
        if not self._records_rollouts():
            return None
        found = self.rollouts.lookup(queries, responses, batch["mask"].shape[1], self.policy_version)
        self.rollouts.clear()  # the policy is about to change: nothing recorded so far stays valid
        if found is None:
            return None
        logprobs, values = found
        return logprobs.to(batch["mask"].device) * batch["mask"], values.to(batch["mask"].device) * batch["mask"]

    def _warn_if_prompt_included(self, queries, responses) -> None:
        if not self.is_encoder_decoder and not self._warned_prompt and responses_repeat_queries(queries, responses):
            self._warned_prompt = True
            logger.warning("every response starts with its query: pass only the generated tokens to step(), "
                           "e.g. from generate(..., return_prompt=False)")

    # ------------------------------------------------------------------ statistics and logging
    def record_step_stats(self, kl_coef: float, **data: Any) -> dict[str, torch.Tensor]:
        """The step statistics (objective/*, ppo/*, tokens/*) as tensors; see `ppo_stats.summarize_step`."""
        return ppo_stats.summarize_step(kl_coef=kl_coef, **data)

    def gather_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Average scalar stats over processes and concatenate distributions; identity in one process."""
        if self.accelerator.num_processes == 1:
            return stats
        return ppo_stats.gather_across_processes(self.accelerator, stats, self.current_device)

    def log_stats(
        self,
        stats: dict[str, Any],
        batch: dict[str, Any],
        rewards: Any,
        columns_to_log: tuple[str, ...] | list[str] = ("query", "response"),
    ) -> dict[str, Any]:
        """Send the step statistics and reward summary to the trackers (`config.log_with`).

        Adds env/reward_mean, env/reward_std, env/reward_dist; returns the logged dict. With wandb, a
        table of the `columns_to_log` texts and their rewards is logged too.
        """
        rewards = ppo_stats.as_score_tensor(rewards).to(self.current_device)
        if self.accelerator.num_processes > 1:
            rewards = self.accelerator.gather(rewards)
        logs = {**stats, **ppo_stats.reward_summary(rewards)}
        if self.accelerator.is_main_process and self.accelerator.trackers:
            self.accelerator.log(ppo_stats.tracker_scalars(logs), step=self.current_step)
            with contextlib.suppress(ValueError, ImportError):  # a table of samples, for wandb only
                table = ppo_stats.wandb_table(batch, rewards, list(columns_to_log))
                if table is not None:
                    wandb_tracker = self.accelerator.get_tracker("wandb", unwrap=True)
                    wandb_tracker.log({"game_log": table}, step=self.current_step)
        return logs

    # ------------------------------------------------------------------ saving and resuming
    def save_pretrained(self, save_directory: str) -> None:
        """Policy (with value head), tokenizer and a model card, into `save_directory`.

        Like transformers' save_pretrained, other files in the folder are left alone (use
        `save_checkpoint` for atomic, resumable snapshots).
        """
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self._write_pretrained(save_directory)

    save_model = save_pretrained

    def _write_pretrained(self, save_directory: str) -> None:
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(save_directory)
        self.tokenizer.save_pretrained(save_directory)
        self.create_model_card(save_directory)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str = "Upload model trained with rlhfkit PPOTrainer",
        private: bool | None = None,
        token: str | None = None,
        branch: str | None = None,
        create_pr: bool = False,
    ) -> Any:
        """Upload what `save_pretrained` writes (policy with value head, tokenizer, model card) to the Hub
        repo `repo_id` in one commit, creating the repo if needed. Needs network access: offline
        (`HF_HUB_OFFLINE=1`) it raises before writing anything; `save_pretrained(folder)` is the offline way.
        Returns the commit info on the main process, None elsewhere."""
        import tempfile

        from huggingface_hub import HfApi, constants

        if not isinstance(repo_id, str) or not repo_id.strip():
            raise ValueError(f"repo_id must be a Hub repository name such as 'user/model', got {repo_id!r}")
        if constants.HF_HUB_OFFLINE:
            raise RuntimeError(
                f"push_to_hub({repo_id!r}) needs network access but HF_HUB_OFFLINE is set; save locally with "
                "trainer.save_pretrained(folder) and upload that folder later"
            )
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return None
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self._write_pretrained(folder)
            return api.upload_folder(
                repo_id=repo_id, folder_path=folder, commit_message=commit_message, revision=branch,
                create_pr=create_pr,
            )

    def create_model_card(self, path: str, model_name: str | None = "rlhfkit Model") -> None:
        """Write README.md into `path`: what was trained, on what, and how to load it."""
        Path(path, "README.md").write_text(self._model_card(path, model_name))

    def _model_card(self, path: str, model_name: str | None) -> str:
        base = self.config.model_name or getattr(self.policy.config, "_name_or_path", "") or "unknown"
        return ppo_stats.MODEL_CARD.format(model_name=model_name, task_name=self.config.task_name or "custom",
                                           steps=self.current_step, base_model=base, path=path)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Everything a resumed run needs: weights (incl. value head), optimizer, scheduler, KL controller,
        running score moments, RNG state and step counter. Atomic: a crash leaves the old checkpoint."""
        ppo_checkpoint.save(self, checkpoint_dir)
        self.checkpoint_dir = str(checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore a `save_checkpoint` folder into this trainer (same model architecture and config)."""
        ppo_checkpoint.load(self, checkpoint_dir)
        self.policy_version += 1
