"""GRPOTrainer.evaluate: the policy's completions of held-out prompts, scored by the training rewards.

Each process takes every `num_processes`-th prompt (a shorter share is topped up with repeats that are
dropped after, so every process samples the same number of times: ZeRO-3 gathers weights for each);
per prompt `num_generations_eval` completions (default `num_generations`) are sampled with the training
sampling options, `per_device_eval_batch_size` completions at a time, and scored. Reported over every
process: TRL's reward and completion statistics (`reward`, `reward_std`, `rewards/<name>/mean|std`,
`frac_reward_zero_std`, `completions/*`); no update and no loss.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate.utils import gather_object

from rlhfkit.trainers.grpo.groups import completion_stats, reward_stats
from rlhfkit.trainers.grpo.setup import prepare_datasets


class EvaluationMethods:
    """Mixed into `GRPOTrainer`: its `evaluate`."""

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Sample `num_generations_eval` completions of every evaluation prompt and log their rewards and
        lengths under `metric_key_prefix` (each set of a dict of datasets under `<prefix>_<name>`)."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if dataset is None:
            raise ValueError(f"{self._owner}.evaluate needs an eval_dataset (given here or to the trainer)")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if eval_dataset is not None:  # raw prompts given here: tokenised like the trainer's own
            dataset, _ = prepare_datasets(dataset, None, self.processing_class, self.args, {})
        start = time.time()
        metrics = evaluation_metrics(self, dataset)
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in metrics.items()}
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


@torch.no_grad()
def evaluation_metrics(trainer: Any, dataset: Any) -> dict[str, float]:
    """Reward and completion statistics of `trainer`'s policy on the tokenised prompt `dataset`."""
    args, accelerator = trainer.args, trainer.accelerator
    group = args.num_generations_eval or args.num_generations
    mine = list(range(accelerator.process_index, len(dataset), accelerator.num_processes))
    real = len(mine) * group  # completions kept
    share = -(-len(dataset) // accelerator.num_processes)
    mine += [mine[-1] if mine else 0] * (share - len(mine))
    per_call = max(1, args.per_device_eval_batch_size // group)
    scores, per_source, lengths, truncated = [], [], [], []
    was_training = trainer.model.training
    trainer.model.eval()
    try:
        for start in range(0, len(mine), per_call):
            groups = trainer._score_groups(dataset[mine[start : start + per_call]], group)
            batch = groups.batch
            scores += batch.scores.tolist()
            per_source += groups.per_source.T.tolist()
            lengths += batch.response_mask.sum(1).tolist()
            truncated += trainer._truncated(batch).tolist()
    finally:
        trainer.model.train(was_training)
    rows = gather_object([list(row) for row in zip(scores, per_source, lengths, truncated)][:real])
    if not rows:
        return {}
    all_scores, all_sources, all_lengths, all_truncated = zip(*rows)
    stats = reward_stats(
        torch.tensor(all_scores), torch.tensor(all_sources).T, trainer.reward_func_names, group
    )
    stats.update(completion_stats(torch.tensor(all_lengths), torch.tensor(all_truncated)))
    _, logged = trainer._flush_reward_logs()  # what reward functions gave log_metric while scoring
    return {**{k: v.item() for k, v in stats.items()}, **logged}
