"""GRPOTrainer.evaluate: the policy's completions of held-out prompts, scored by the training rewards.

Each process takes every `num_processes`-th prompt (a shorter share is topped up with repeats that are
dropped after, so every process samples the same number of times: ZeRO-3 gathers weights for each);
per prompt `num_generations_eval` completions (default `num_generations`) are sampled with the training
sampling options, `per_device_eval_batch_size` completions at a time, and scored. Reported over every
process: TRL's reward and completion statistics (`reward`, `reward_std`, `rewards/<name>/mean|std`,
`frac_reward_zero_std`, `completions/*`) and `loss`: the training loss of each chunk of whole groups as
if it were an on-policy update (advantages from its own groups' rewards); nothing is trained.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from accelerate.utils import gather_object

from rlhfkit.trainers.grpo.groups import completion_stats, reward_stats
from rlhfkit.trainers.grpo.prompt_stream import is_stream
from rlhfkit.trainers.grpo.setup import prepare_eval_set


class EvaluationMethods:
    """Mixed into `GRPOTrainer`: its `evaluate`."""

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Sample `num_generations_eval` completions of every evaluation prompt and log their rewards, lengths
        and loss under `metric_key_prefix` (each set of a dict of datasets under `<prefix>_<name>`)."""
        given = eval_dataset is not None
        dataset = eval_dataset if given else self.eval_dataset
        if dataset is None:
            raise ValueError(f"{self._owner}.evaluate needs an eval_dataset (given here or to the trainer)")
        parts = dataset.items() if isinstance(dataset, dict) else [(None, dataset)]
        metrics = {}
        for name, part in parts:
            prefix = metric_key_prefix if name is None else f"{metric_key_prefix}_{name}"
            prompts = None if given else self._eval_prompts.get(name)
            if prompts is None:  # given here, or a stream: tokenised now, like the trainer's own
                prompts = prepare_eval_set(part, self.processing_class, self.args, {}, name)
            metrics.update(self._evaluate_prompts(prompts, prefix))
        return metrics

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """`Trainer.get_eval_dataloader`, with no worker processes for a stream (a stream is not split between
        workers as indexed rows are: a torch IterableDataset is read whole by each). Only this loader: the
        configured worker count is set back, so a map-style train set keeps its workers."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(eval_dataset, str):  # the name of one of a dict of evaluation sets
            dataset = self.eval_dataset[eval_dataset]
        if not is_stream(dataset):
            return super().get_eval_dataloader(eval_dataset)
        workers, self.args.dataloader_num_workers = self.args.dataloader_num_workers, 0
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.args.dataloader_num_workers = workers

    def _evaluate_prompts(self, dataset: Any, prefix: str) -> dict[str, float]:
        start = time.time()
        metrics = {f"{prefix}_{k}": v for k, v in evaluation_metrics(self, dataset).items()}
        metrics[f"{prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


@torch.no_grad()
def evaluation_metrics(trainer: Any, dataset: Any) -> dict[str, float]:
    """Reward and completion statistics, and the loss, of `trainer`'s policy on the tokenised prompt
    `dataset`."""
    args, accelerator = trainer.args, trainer.accelerator
    group = args.num_generations_eval or args.num_generations
    mine = list(range(accelerator.process_index, len(dataset), accelerator.num_processes))
    real = len(mine) * group  # completions kept
    share = -(-len(dataset) // accelerator.num_processes)
    mine += [mine[-1] if mine else 0] * (share - len(mine))
    per_call = max(1, args.per_device_eval_batch_size // group)
    scores, per_source, lengths, truncated, losses = [], [], [], [], []
    was_training = trainer.model.training
    trainer.model.eval()
    try:
        for start in range(0, len(mine), per_call):
            groups = trainer._score_groups(dataset[mine[start : start + per_call]], group)
            batch = groups.batch
            scores += batch.scores.tolist()
            per_source += groups.per_source.T.tolist()
            lengths += batch.model_tokens().sum(1).tolist()
            truncated += trainer._truncated(batch).tolist()
            losses += [evaluation_loss(trainer, groups, group)] * len(batch)
    finally:
        trainer.model.train(was_training)
    rows = gather_object([list(row) for row in zip(scores, per_source, lengths, truncated, losses)][:real])
    if not rows:
        return {}
    all_scores, all_sources, all_lengths, all_truncated, all_losses = zip(*rows)
    stats = reward_stats(
        torch.tensor(all_scores), torch.tensor(all_sources).T, trainer.reward_func_names, group
    )
    stats.update(completion_stats(torch.tensor(all_lengths), torch.tensor(all_truncated)))
    stats["loss"] = torch.tensor(all_losses).mean()  # weighted by completions
    _, logged = trainer._flush_reward_logs()  # what reward functions gave log_metric while scoring
    return {**{k: v.item() for k, v in stats.items()}, **logged}


def evaluation_loss(trainer: Any, groups: Any, group_size: int) -> float:
    """The training loss of one evaluation chunk of whole groups, as if it were an on-policy update: its
    advantages from these groups' rewards (0 with one completion per prompt), its reference logprobs when
    there is a KL term."""
    batch = groups.batch
    if group_size > 1:
        advantages, _ = trainer._advantages(batch, batch.scores, groups.per_source, group_size)
    else:  # a lone completion is its own baseline: advantage 0
        advantages = torch.zeros_like(batch.scores)
    batch = batch.replace(advantages=advantages.to(batch.scores.device))
    if trainer.reference is not None:
        batch = batch.replace(ref_logprobs=trainer._reference_logprobs(batch))
    on_policy, trainer._on_policy = trainer._on_policy, True  # the old logprobs are the current ones
    try:
        tokens = max(float(batch.loss_mask.sum()), 1.0)
        loss, _ = trainer._loss(trainer.model, batch, tokens, len(batch), training=False)
    finally:
        trainer._on_policy = on_policy
    return float(loss)
