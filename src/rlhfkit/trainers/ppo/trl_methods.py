"""TRL's finer-grained `PPOTrainer` methods, kept for code written against TRL.

Each is a thin wrapper over the function `step()` itself calls (`inputs.check_step_inputs`,
`rollout.scoring.forward_batch`, `core.rewards.compute_token_rewards`, `core.advantages.whitened_gae`,
`update.minibatch_loss`), so the two paths cannot drift apart; none of them is on the step path.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhfkit.core.advantages import whitened_gae
from rlhfkit.core.kl import kl_penalty
from rlhfkit.core.rewards import compute_token_rewards
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.guards import any_across_ranks
from rlhfkit.trainers.ppo.inputs import check_step_inputs
from rlhfkit.trainers.ppo.update import minibatch_loss

MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


class TRLMethods:
    """Mixed into `PPOTrainer`; relies on its `config`, `kl_ctl`, `accelerator` and forward helpers."""

    def prepare_model_inputs(self, queries: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]:
        """TRL's model inputs for lists of 1-D query and response ids: query + response padded on the
        tokenizer's padding side (an encoder-decoder: the queries, and the responses as decoder inputs), on
        the trainer's device; no labels."""
        pad = self.tokenizer.pad
        if self.is_encoder_decoder:
            encoder = pad({"input_ids": [q.tolist() for q in queries]}, return_tensors="pt")
            decoder = pad({"input_ids": [r.tolist() for r in responses]}, return_tensors="pt")
            inputs = {
                **encoder,
                "decoder_input_ids": decoder["input_ids"],
                "decoder_attention_mask": decoder["attention_mask"],
            }
        else:
            joined = [torch.cat([q, r]).tolist() for q, r in zip(queries, responses)]
            inputs = dict(pad({"input_ids": joined}, return_tensors="pt"))
        return {k: v.to(self.current_device) for k, v in inputs.items() if k in MODEL_INPUT_KEYS}

    def _step_safety_checker(
        self,
        batch_size: int,
        queries: list[torch.Tensor],
        responses: list[torch.Tensor],
        scores: list[torch.Tensor],
        masks: list[torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]:
        """TRL's name for the checks `step()` runs on its arguments (`inputs.check_step_inputs`), for
        `batch_size` samples; returns the lists moved to the trainer's device, scores as 0-d float32."""
        queries, responses, score_values, masks = check_step_inputs(
            queries, responses, scores, masks, batch_size, self.current_device
        )
        return queries, responses, list(score_values.unbind(0)), masks

    def _kl_penalty(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        """TRL's per-token KL of `config.kl_penalty` ("kl", "abs", "mse"; "full" reads (B, T, V) log-softmax
        tensors and sums over the vocabulary), through `core.kl.kl_penalty`."""
        if self.config.kl_penalty == "full":
            sampled = logprob[..., 0]  # (B, T), unread by the full estimator
            return kl_penalty(sampled, ref_logprob[..., 0], "full", logits=logprob, ref_logits=ref_logprob)
        return kl_penalty(logprob, ref_logprob, self.config.kl_penalty)

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

        batch = RolloutBatch.from_sequences(queries, responses, self._pad_id(), response_masks)
        out = self._forward_batch(model, batch, return_logits, isinstance(model, PreTrainedModelWrapper))
        return out.logprobs, out.logits, out.values, batch.loss_mask

    def compute_rewards(
        self, scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, masks: torch.Tensor,
        logits: torch.Tensor | None = None, ref_logits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Per-token rewards -kl_coef * KL_t plus the score on the last trained token.

        scores (B,); logprobs, ref_logprobs, masks (B, R); logits (B, R, V) only for kl_penalty='full'.
        Returns (rewards, non_score_rewards, kls), each (B, R).
        """
        return compute_token_rewards(
            scores,
            logprobs,
            ref_logprobs,
            masks,
            kl_coef=self.kl_ctl.value,
            kl_penalty=self.config.kl_penalty,
            logits=logits,
            ref_logits=ref_logits,
        )

    def compute_advantages(
        self, values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE over trained tokens, advantages whitened.

        Returns (values, advantages, returns), each (B, R).
        """
        cfg = self.config
        advantages, returns = whitened_gae(
            values, rewards, mask, cfg.gamma, cfg.lam, whiten_rewards=cfg.whiten_rewards
        )
        return values, advantages, returns

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
        """Clipped policy loss and vf_coef * clipped value loss (masked means), plus their statistics."""
        return minibatch_loss(
            self.config,
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            vpreds=vpreds,
            values=values,
            advantages=advantages,
            returns=returns,
            mask=mask,
            logits=logits,
            entropy=entropy,
        )

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
        skip = any_across_ranks(
            bool(stats["policy/ratio_mean"] > self.config.ratio_threshold), self.accelerator
        )
        stats["policy/skipped"] = torch.tensor(float(skip))
        if not skip:
            self.accelerator.backward((pg_loss + vf_loss) * loss_weight)
            if optimizer_step:
                self._optimizer_step()
        return stats
