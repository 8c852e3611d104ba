"""The sampler/trainer mismatch correction in GRPO's loop (maths: `core.sampler_correction`; fields and
when it is on: `config.SamplerCorrection`).

When it is on, each generation batch gets one more forward pass without gradient, as TRL's does with vLLM:
the training policy's logprobs of the sampled tokens, kept as the batch's `old_logprobs`. They are the old
policy of every later update of the batch (the clipped ratio is pi / pi_old, not pi / pi_sampler), and the
bounded weight pi_old / pi_sampler multiplies the policy term of each update's loss. Its min/mean/max over
the generation batch (all processes) are logged under TRL's names, `sampling/importance_sampling_ratio/*`.
"""

from __future__ import annotations

import torch

from rlhfkit.core.sampler_correction import importance_weight_stats, sampler_importance_weights
from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.guards import any_across_ranks

STAT_NAMES = ("min", "mean", "max")


class SamplerCorrectionMethods:
    """Mixed into `GRPOTrainer`; relies on its `args`, `accelerator` and `_policy_logprobs_now`."""

    def _sampler_correction_on(self) -> bool:
        active = getattr(self.args, "sampler_correction_active", None)  # a config without the fields: off
        return bool(active is not None and active())

    @torch.no_grad()
    def _with_old_logprobs(
        self, batch: RolloutBatch, processed: bool = False
    ) -> tuple[RolloutBatch, dict[str, float]]:
        """`batch` with the training policy's `old_logprobs` and the weights' statistics, when the
        correction is on; else `batch` unchanged and no metrics. Logprobs the sampler reports `processed`
        (an engine's, after top-k/top-p/min-p, a penalty or a constraint: `GenerationOutput`) are no old
        policy: the training pass gives `old_logprobs` then with the correction off too, and
        `sampling/logprobs_processed` tells the health alarm that their gap is no engine mismatch."""
        correct = self._sampler_correction_on()
        processed = any_across_ranks(processed, self.accelerator)  # the pass below may be a collective
        flag = {"sampling/logprobs_processed": 1.0} if processed else {}
        if not correct and not processed:
            return batch, {}
        with self.accelerator.autocast():
            batch = batch.replace(old_logprobs=self._policy_logprobs_now(batch))
        if not correct:
            return batch, flag
        mode = self.args.vllm_importance_sampling_mode
        stats = importance_weight_stats(self._sampler_weights(batch), batch.loss_mask, mode)
        everywhere = self.accelerator.gather(stats[None].to(self.accelerator.device)).float()  # (P, 3)
        known = everywhere[~everywhere.isnan().any(1)]
        if not len(known):  # no loss token anywhere: nothing to report
            return batch, flag
        summary = (known[:, 0].min(), known[:, 1].mean(), known[:, 2].max())
        return batch, {
            **flag,
            **{
                f"sampling/importance_sampling_ratio/{name}": v.item() for name, v in zip(STAT_NAMES, summary)
            },
        }

    @staticmethod
    def _old_logprobs(rows: RolloutBatch) -> torch.Tensor:
        """The old policy's logprobs of an off-policy update: the training pass's when the correction
        computed them, else the sampler's (streamed out of generation)."""
        return rows.logprobs if rows.old_logprobs is None else rows.old_logprobs

    def _sampler_weights(self, rows: RolloutBatch) -> torch.Tensor | None:
        """(N, R) importance weights of `rows`, or None without the correction."""
        if rows.old_logprobs is None or not self._sampler_correction_on():
            return None
        args = self.args
        return sampler_importance_weights(
            rows.old_logprobs,
            rows.logprobs,
            rows.loss_mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
