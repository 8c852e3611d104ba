"""What GRPO reports besides its rewards: update statistics, and tables of sampled completions.

An update's statistics are reduced over its micro-batches and over processes, with TRL's min/max extras;
with `log_completions`, the completions are printed and saved every `logging_steps` updates.
"""

from __future__ import annotations

import warnings

import torch

from rlhfkit.rollout.batch import RolloutBatch
from rlhfkit.trainers.common.progress import print_sample_table, save_samples, text_writer
from rlhfkit.trainers.grpo.groups import SampledGroups


class ReportingMethods:
    """Mixed into `GRPOTrainer`; relies on its `args`, `accelerator`, `state`, `processing_class` and
    `reward_func_names`."""

    def _log_completions(
        self, groups: SampledGroups, batch: RolloutBatch, extra_columns: dict[str, list] | None = None
    ) -> None:
        """Print and save a table of this generation batch's completions; `extra_columns` (what reward
        functions gave `log_extra`, one value per completion) become columns of the saved table."""
        args = self.args
        if (
            not args.log_completions
            or self.state.global_step % max(1, int(args.logging_steps))
            or not self.is_world_process_zero()
        ):
            return
        # the first completion of each prompt only, with log_unique_prompts
        rows = range(0, len(groups), args.num_generations) if args.log_unique_prompts else range(len(groups))
        rows = list(rows)[: args.num_completions_to_print or None]
        prompts = self.processing_class.batch_decode(batch.query_ids[rows], skip_special_tokens=True)
        completions = [groups.completions[i] for i in rows]
        scores = batch.scores[rows].tolist()
        title = f"completions, update {self.state.global_step}"
        print_sample_table(prompts, completions, scores, title=title)
        per_source = None
        if len(self.reward_func_names) > 1:  # each reward function's own score, next to the weighted sum
            per_source = {
                f"score/{name}": values[rows].tolist()
                for name, values in zip(self.reward_func_names, groups.per_source)
            }
        for name, values in (extra_columns or {}).items():
            if len(values) != len(groups):  # e.g. dynamic sampling's several rounds: rows no longer line up
                warnings.warn(
                    f"log_extra column {name!r} has {len(values)} values for {len(groups)} completions; "
                    "it is left out of the completions table",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            per_source = {**(per_source or {}), name: [values[i] for i in rows]}
        save_samples(
            args.output_dir,
            self.state.global_step,
            prompts,
            completions,
            scores,
            table="completions",
            columns=per_source,
            writer=text_writer(self),
        )

    def _reduce(self, stats: dict[str, list[torch.Tensor]]) -> dict[str, float]:
        """Micro-batch statistics -> one number each, over micro-batches and processes (TRL's min/max
        extras)."""
        local = {k: torch.stack(v).float() for k, v in stats.items()}
        summed = ("loss", "policy_loss")  # each micro-batch's loss is its share of the step's
        rows = torch.stack([local[k].sum() if k in summed else local[k].mean() for k in local])
        extremes = torch.stack([local[k].max() for k in local])
        everywhere = self.accelerator.gather(torch.stack([rows, extremes])[None])  # (P, 2, K)
        out = dict(zip(local, everywhere[:, 0].mean(0).tolist()))
        highs = dict(zip(local, everywhere[:, 1].max(0).values.tolist()))
        lows = dict(zip(local, everywhere[:, 0].min(0).values.tolist()))
        out["clip_ratio/low_min"] = lows["clip_ratio/low_mean"]
        out["clip_ratio/high_max"] = highs["clip_ratio/high_mean"]
        if "sampling/sampling_logp_difference/max" in local:
            out["sampling/sampling_logp_difference/max"] = highs["sampling/sampling_logp_difference/max"]
        return out

    @torch.no_grad()
    def _sampling_gap(self, logprobs: torch.Tensor, rows: RolloutBatch) -> dict[str, torch.Tensor]:
        """|training - sampling| logprob over the trained tokens, on the first update of a generation batch
        (same weights: ~0 unless the two engines differ); {} on later ones."""
        if not self._on_policy:
            return {}
        gap = (logprobs.detach() - rows.logprobs).abs()[rows.loss_mask.bool()]
        zero = gap.new_zeros(())
        return {
            "sampling/sampling_logp_difference/mean": gap.mean() if gap.numel() else zero,
            "sampling/sampling_logp_difference/max": gap.max() if gap.numel() else zero,
        }

    def _model_card_lines(self) -> list[str]:
        args = self.args
        return [
            "group relative policy optimisation (GRPO)",
            f"- completions per prompt (num_generations): {args.num_generations}",
            f"- loss_type: {args.loss_type}, beta: {args.beta}, "
            f"reward functions: {', '.join(self.reward_func_names)}",
            f"- updates: {self.state.global_step}",
            f"- completions trained on: {self.state.global_step * self._episodes_per_update()}",
            "",
            "GRPO: Shao et al., *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language "
            "Models*, 2024 (arXiv:2402.03300).",
        ]
