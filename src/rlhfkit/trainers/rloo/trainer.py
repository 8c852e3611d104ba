"""RLOOTrainer in TRL 0.x's form: REINFORCE leave-one-out (Ahmadian et al. 2024) on `transformers.Trainer`.

One update:
  1. take `local_batch_size / rloo_k` prompts and sample `rloo_k` completions of each, in chunks of
     `local_rollout_forward_batch_size` rows, cut after the stop token; the sampling logprobs are kept
     while generating (no second policy pass, unless an engine reports processed ones);
  2. reference logprobs, and scores from the reward model(s) / function(s);
  3. the missing-eos penalty;
  4. the RLHF reward: score - kl_coef * KL to the reference (per sequence or per token);
  5. optional reward whitening (Reinforce++ normalize_reward acts on the scores, before step 4);
  6. advantages: leave-one-out baseline over the k completions of each prompt (optionally normalised);
  7. num_ppo_epochs x num_mini_batches clipped sequence-level policy-gradient steps, with gradient
     accumulation over micro-batches of per_device_train_batch_size.
The rollout travels from step 1 to step 7 as a `RolloutBatch` with one row per completion: the k completions
of a prompt sit on consecutive rows (completion j of prompt i in row i * k + j, GRPO's layout too), its query
repeated on each; `advantages` holds one number per completion.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Any

import torch
from torch import nn
from transformers import ProgressCallback, Trainer

from rlhfkit.core import (
    masked_mean,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    rloo_advantages,
)
from rlhfkit.core.rewards import apply_missing_eos_penalty, compute_rlhf_reward
from rlhfkit.models.reference import choose_reference
from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.rollout import SamplingParams, forward_response
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.guards import RobustTrainerMixin, any_across_ranks
from rlhfkit.trainers.common.online_loop import OnlineTrainerLoop
from rlhfkit.trainers.common.progress import RichProgressCallback
from rlhfkit.trainers.common.prompts import (
    PromptSchedule,
    check_prompts,
    datasets_by_argument,
    tokenize_datasets,
)
from rlhfkit.trainers.common.trainer_setup import disable_dropout
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.forms import RLOOTrainer

__all__ = ["ClassicRLOOTrainer", "RLOOTrainer"]


def _check_arguments(config: Any, processing_class: Any, policy: Any, ref_policy: Any) -> None:
    """Clear errors for a wrong config, a tokenizer without a pad token, or a policy that is not a model."""
    if not isinstance(config, RLOOConfig):
        raise TypeError(f"config must be an RLOOConfig, got {type(config).__name__}")
    if processing_class is None or getattr(processing_class, "pad_token_id", None) is None:
        raise ValueError("processing_class must be a tokenizer with a pad token (set its pad_token)")
    for name, model in (("policy", policy), ("ref_policy", ref_policy)):
        if not isinstance(model, nn.Module) and (name == "policy" or model is not None):
            raise TypeError(f"{name} must be a loaded model (nn.Module), got {type(model).__name__}")


class ClassicRLOOTrainer(RLOOTrainer, OnlineTrainerLoop, RobustTrainerMixin, Trainer):
    """Trains `policy` with RLOO against a frozen `ref_policy`; see `RLOOConfig` for every option.

    `ref_policy=None` takes the reference from the policy (`rlhfkit.models.reference.choose_reference`):
    for a PEFT policy its frozen SFT adapter or its adapter-disabled base (no second copy of the weights),
    otherwise a frozen copy of the policy.

    `reward_model` is a sequence-classification model, a callable `list[str] -> list[float]` on the decoded
    completions (given `prompts=` too when it accepts that keyword), or a list of these combined with
    `config.reward_weights`. `reward_processing_class` is the reward model's tokenizer when it differs
    from the policy's (one per source for a list).
    """

    _tag_names = ["rlhfkit", "rloo"]

    def __init__(
        self,
        config: RLOOConfig,
        processing_class: Any,
        policy: nn.Module,
        ref_policy: nn.Module | None,
        reward_model: Any,
        train_dataset: Any,
        data_collator: Any = None,
        eval_dataset: Any = None,
        optimizers: tuple = (None, None),
        callbacks: list | None = None,
        reward_processing_class: Any = None,
    ) -> None:
        _check_arguments(config, processing_class, policy, ref_policy)
        config.settle("classic")
        self.reference = choose_reference(policy, ref_policy, argument="ref_policy")
        ref_policy = self.reference.model
        self.stop_token_id = config.stop_token_id
        if self.stop_token_id is None and config.stop_token == "eos":
            self.stop_token_id = processing_class.eos_token_id
        rewards = list(reward_model) if isinstance(reward_model, (list, tuple)) else [reward_model]
        # dropout off: the logprobs taken while sampling must equal those of the training forward pass
        for model in (policy, ref_policy, *rewards):
            if isinstance(model, nn.Module):
                disable_dropout(model)
        train_dataset, eval_dataset = tokenize_datasets(
            train_dataset, eval_dataset, processing_class, config.dataset_num_proc
        )
        models = {"policy": policy} if ref_policy is None else {"policy": policy, "ref_policy": ref_policy}
        if reward_processing_class is None:  # reward models then read the policy's token ids
            models.update({f"reward model {i}": r for i, r in enumerate(rewards) if isinstance(r, nn.Module)})
        for what, dataset in datasets_by_argument(train_dataset, eval_dataset).items():
            check_prompts(dataset, what, config.response_length, models)

        # Trainer's leading arguments in its order: model, args, data_collator, datasets, processing_class
        super().__init__(
            policy,
            config,
            data_collator,
            train_dataset,
            eval_dataset,
            processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        config.world_size = self.accelerator.num_processes
        config.compute_batch_sizes(len(train_dataset))
        self.policy = policy
        self.ref_policy = ref_policy.to(self.accelerator.device) if ref_policy is not None else None
        self._setup_rollout(reward_model, reward_processing_class)
        if not config.disable_tqdm:
            self.remove_callback(ProgressCallback)
            self.add_callback(RichProgressCallback())

    def _setup_rollout(self, reward_model: Any, reward_processing_class: Any) -> None:
        """The reward scorer, the order prompts are handed out in, and the sampling parameters."""
        config = self.args
        self.scorer = RewardScorer(
            reward_model,
            self.processing_class,
            reward_processing_class,
            config.reward_weights,
            self.accelerator.device,
        )
        self.schedule = PromptSchedule(
            len(self.train_dataset),
            config.local_prompt_batch_size,
            config.world_size,
            self.accelerator.process_index,
            config.seed,
        )
        self.sampling_params = SamplingParams(
            max_new_tokens=config.response_length,
            temperature=config.temperature,
            top_k=0,
            top_p=1.0,
            stop_token_ids=None if self.stop_token_id is None else (self.stop_token_id,),
        )

    # ------------------------------------------------------------------ the shared loop's hooks
    _loss_metric = "loss/policy_avg"
    _health_metrics = "rloo"

    def _num_updates(self) -> int:
        return self.args.num_total_batches

    def _episodes_per_update(self) -> int:
        return self.args.batch_size

    def _sample_generations_freq(self) -> int:
        return self.args.sample_generations_freq

    def _forward_chunk_size(self) -> int:
        return self.args.local_rollout_forward_batch_size

    # ------------------------------------------------------------------ steps 1-6
    @torch.no_grad()
    def _rollout(self, update: int) -> tuple[RolloutBatch, dict[str, float]]:
        args = self.args
        # 1. k completions of each prompt, with the logprobs they were sampled with
        batch = self._sample(self._prompts(update))
        # 2. reference logprobs and scores
        batch = batch.replace(ref_logprobs=self._reference_logprobs(batch), scores=self._score(batch))
        # 3. completions that never emit eos lose missing_eos_penalty
        has_eos = ((batch.responses == self.processing_class.eos_token_id) & batch.response_mask).any(1)
        scores = batch.scores
        if args.missing_eos_penalty is not None:
            scores = apply_missing_eos_penalty(scores, has_eos, args.missing_eos_penalty)
        # 4. RLHF reward = score - kl_coef * KL(policy || reference); Reinforce++'s normalize_reward
        # standardises and clips the scores themselves, before the KL term is added
        rlhf_reward, non_score_reward, kl = compute_rlhf_reward(
            scores,
            batch.logprobs,
            batch.ref_logprobs,
            batch.response_mask,
            args.kl_coef,
            args.token_level_kl,
            args.classic_clip_range if args.normalize_reward else None,
        )
        # 5. optional whitening of the rewards
        scaled_reward = (
            masked_whiten(rlhf_reward, None, shift_mean=False) if args.whiten_rewards else rlhf_reward
        )
        # 6. leave-one-out advantages, one per completion
        advantages = rloo_advantages(scaled_reward, args.rloo_k)
        if args.normalize_advantage:
            advantages = masked_whiten(advantages, None)

        gather = self.accelerator.gather  # not gather_for_metrics: it drops rows after any uneven dataloader
        metrics = {
            "objective/kl": gather(kl.sum(1)).mean().item(),
            "objective/entropy": gather((-batch.logprobs * batch.response_mask).sum(1)).mean().item(),
            "objective/non_score_reward": gather(non_score_reward).mean().item(),
            "objective/rlhf_reward": gather(rlhf_reward).mean().item(),
            "objective/scores": gather(scores).mean().item(),
            "val/num_eos_tokens": gather(has_eos.sum()[None]).sum().item(),
            "completions/mean_length": gather(batch.response_mask.sum(1).float()).mean().item(),
        }
        return batch.replace(scores=scores, advantages=advantages), metrics

    def _prompts(self, update: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's prompts for `update`, left-padded: (query_ids, query_mask), each (B, Q)."""
        return self._pad_prompts(self.train_dataset[self.schedule.indices(update)]["input_ids"])

    def _sample(self, prompts: tuple[torch.Tensor, torch.Tensor]) -> RolloutBatch:
        """`rloo_k` completions of each of the B prompts: completion j of prompt i in row i * rloo_k + j.

        Sampled `local_rollout_forward_batch_size` rows at a time, each cut after the stop token; the
        sampling logprobs are kept (no second policy pass), unless an inference engine reports them processed
        (`GenerationOutput.logprobs_processed`). Columns past the longest completion are dropped.
        """
        args = self.args
        query_ids, query_mask = prompts
        num_prompts = query_ids.shape[0]
        prompt_of_row = torch.arange(num_prompts, device=query_ids.device).repeat_interleave(args.rloo_k)
        query_ids, query_mask = query_ids[prompt_of_row], query_mask[prompt_of_row]
        out = self._sampler(chunk_size=args.local_rollout_forward_batch_size).generate(
            query_ids, query_mask, self.sampling_params, logprob_temperature=args.temperature
        )
        batch = RolloutBatch(
            query_ids, query_mask, out.responses, out.response_mask, out.response_mask, logprobs=out.logprobs
        ).trimmed()
        # an engine's logprobs of a penalised distribution (a model's repetition_penalty) are no old policy
        if any_across_ranks(out.logprobs_processed, self.accelerator):
            batch = batch.replace(logprobs=self._policy_logprobs_now(batch))
        return batch

    def _score(self, batch: RolloutBatch) -> torch.Tensor:
        """(N,) scores of the completions from the reward model(s) / function(s)."""
        return torch.cat([self.scorer(*chunk)[0] for chunk in self._forward_chunks(batch)])

    # ------------------------------------------------------------------ step 7
    def _optimize(self, model: nn.Module, batch: RolloutBatch) -> dict[str, float]:
        args = self.args
        stats = defaultdict(list)
        for _ in range(args.num_ppo_epochs):
            order = torch.randperm(args.local_batch_size, device=self.accelerator.device)
            for mb_start in range(0, args.local_batch_size, args.local_mini_batch_size):
                mini_batch = order[mb_start : mb_start + args.local_mini_batch_size]
                num_micro = math.ceil(len(mini_batch) / args.per_device_train_batch_size)
                for i, (idx, rows) in enumerate(
                    batch.minibatches(args.per_device_train_batch_size, mini_batch)
                ):
                    # the queries keep the rollout's width, as in `_forward_chunks`
                    rows = rows.replace(query_ids=batch.query_ids[idx], query_mask=batch.query_mask[idx])
                    # gradients are synchronised across processes once per mini-batch, on its last micro-batch
                    sync = contextlib.nullcontext() if i == num_micro - 1 else self.accelerator.no_sync(model)
                    with sync:
                        step_stats = self._micro_step(model, rows)
                    for key, value in step_stats.items():
                        stats[key].append(value)
                if args.max_grad_norm:
                    self.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                self.guarded_optimizer_step(model, scores=batch.scores)  # skipped if non-finite
                self.optimizer.zero_grad()
        means = torch.stack([torch.stack(stats[key]).mean() for key in stats])
        means = self.accelerator.reduce(means, reduction="mean")
        return {key: value.item() for key, value in zip(stats, means)}

    def _micro_step(self, model: nn.Module, rows: RolloutBatch) -> dict[str, torch.Tensor]:
        mask = rows.response_mask
        with self.accelerator.autocast():
            out = forward_response(
                model,
                rows.query_ids,
                rows.query_mask,
                rows.responses,
                mask,
                temperature=self.args.temperature,
                with_entropy=True,
            )
        # RLOO treats a whole completion as one action: the ratio is that of sequence probabilities
        new_seq = (out.logprobs * mask).sum(1)
        old_seq = (rows.logprobs * mask).sum(1)
        loss = ppo_policy_loss(new_seq, old_seq, rows.advantages, None, self.args.cliprange)
        self.accelerator.backward(loss.loss / self.args.gradient_accumulation_steps)
        with torch.no_grad():
            token_ratio = torch.exp(out.logprobs - rows.logprobs)
            return {
                "policy/approxkl_avg": loss.approxkl,
                "policy/clipfrac_avg": loss.clipfrac,
                "loss/policy_avg": loss.loss.detach(),
                "val/clipfrac_avg": loss.loss.new_zeros(()),  # no value function in RLOO; for dashboards
                "policy/entropy_avg": masked_mean(out.entropy, mask),
                "val/ratio": masked_mean(token_ratio, mask),
                "val/ratio_var": masked_var(token_ratio, mask, unbiased=False),
            }

    # ------------------------------------------------------------------ model card
    def _model_card_lines(self) -> list[str]:
        return [
            "REINFORCE leave-one-out (RLOO)",
            f"- completions per prompt (rloo_k): {self.args.rloo_k}",
            f"- KL coefficient: {self.args.kl_coef}",
            f"- updates: {self.state.global_step}",
            f"- episodes: {self.state.global_step * self.args.batch_size}",
            "",
            "RLOO: Ahmadian et al., *Back to Basics: Revisiting REINFORCE Style Optimization for Learning "
            "from Human Feedback in LLMs*, 2024 (arXiv:2402.14740).",
        ]
