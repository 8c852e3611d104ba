"""RewardTrainer: fit a scalar reward model to preference pairs with the Bradley-Terry loss.

For each pair the model scores the chosen and the rejected sequence (one forward pass over both),
and the loss -log sigmoid(r_chosen - r_rejected - margin) pushes the chosen score above the
rejected one; an optional centring term keeps scores near zero. With a LoRA `peft_config`
(task_type "SEQ_CLS") the score head is trained and saved with the adapter, so the output folder
loads as a `reward_adapter` for multi-adapter RL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from rlhfkit.core.losses import pairwise_reward_loss
from rlhfkit.data.chat_templates import apply_chat_template_path
from rlhfkit.data.collators import DataCollatorForPreference, RewardDataCollatorWithPadding, cat_padded
from rlhfkit.data.preference import prepare_reward_dataset
from rlhfkit.trainers.common.trainer_setup import (
    MetricBuffer,
    OfflineTrainer,
    disable_dropout,
    load_policy,
    set_special_tokens,
)
from rlhfkit.trainers.reward_model.config import RewardConfig

logger = logging.getLogger(__name__)

__all__ = ["DataCollatorForPreference", "RewardTrainer", "compute_accuracy"]


def compute_accuracy(eval_pred) -> dict[str, float]:
    """Fraction of pairs whose chosen score beats the rejected one (a tie counts as half).

    eval_pred.predictions: (N, 2) array of [r_chosen, r_rejected].
    """
    predictions = np.asarray(eval_pred.predictions)
    chosen, rejected = predictions[:, 0], predictions[:, 1]
    wins = (chosen > rejected).astype(np.float64) + 0.5 * (chosen == rejected)
    return {"accuracy": float(wins.mean())}


class RewardTrainer(OfflineTrainer):
    """`transformers.Trainer` for reward models (AutoModelForSequenceClassification, num_labels=1).

    Keyword arguments `max_length` and `peft_config` follow TRL 0.x; `max_length` overrides
    `args.max_length`, and TRL 0.x's `tokenizer=` is another name for `processing_class=`. Datasets
    may be tokenised already (input_ids_chosen, attention_mask_chosen,
    input_ids_rejected, attention_mask_rejected) or raw `chosen` / `rejected` text (optionally with
    `prompt`) or chats, which are tokenised here with `processing_class`. An optional `margin`
    column is subtracted from the score gap inside the loss.
    """

    config_class = RewardConfig
    default_output_dir = "reward_model"
    model_tag = "reward-trainer"
    override_keywords = ("max_length",)
    default_compute_metrics = staticmethod(compute_accuracy)
    # compute_loss returns a per-pair mean, so Trainer must divide by the accumulation steps itself
    loss_is_scaled_for_ga = False

    def _setup(
        self, model: Any, args: RewardConfig, processing_class: Any, peft_config: Any
    ) -> tuple[Any, Any]:
        owner = type(self).__name__
        set_special_tokens(processing_class, owner, pad_token=args.pad_token, eos_token=args.eos_token)
        if processing_class is not None:
            apply_chat_template_path(processing_class, args.chat_template_path, owner)
        model = load_policy(
            model,
            AutoModelForSequenceClassification,
            {"num_labels": 1, **args.from_pretrained_kwargs()},
            peft_config,
            type(self).__name__,
            args.seed,
        )
        if model is not None:
            self._check_one_label(model)
            if args.disable_dropout:
                disable_dropout(model)
            self._ensure_pad_token(model, processing_class)
            if args.eos_token is not None and getattr(model, "config", None) is not None:
                model.config.eos_token_id = processing_class.eos_token_id
        self.overlong_counts: dict[str, dict[str, int]] = {}
        self._metrics = MetricBuffer()
        return model, args

    def _default_collator(self, args: RewardConfig, processing_class: Any) -> Callable:
        if processing_class is None:
            raise ValueError(
                f"{type(self).__name__}: the default RewardDataCollatorWithPadding needs `processing_class` "
                "(or `tokenizer`)"
            )
        return RewardDataCollatorWithPadding(processing_class, pad_to_multiple_of=args.pad_to_multiple_of)

    @staticmethod
    def _check_one_label(model: nn.Module) -> None:
        """A reward model gives one score per sequence; a classifier head of another width is refused."""
        num_labels = getattr(getattr(model, "config", None), "num_labels", 1)
        if num_labels != 1:
            raise ValueError(
                f"RewardTrainer: `model` must output one score per sequence (config num_labels=1), but has "
                f"num_labels={num_labels}; load it with AutoModelForSequenceClassification(..., num_labels=1)"
            )

    @staticmethod
    def _ensure_pad_token(model: nn.Module, tokenizer: Any) -> None:
        """The score is read at the last non-pad token, so the model must use the tokenizer's pad id."""
        config = getattr(model, "config", None)
        if config is None:
            return
        model_pad, tokenizer_pad = (
            getattr(config, "pad_token_id", None),
            getattr(tokenizer, "pad_token_id", None),
        )
        if tokenizer_pad is None:
            if model_pad is None:
                raise ValueError(
                    "RewardTrainer: neither the model config nor the tokenizer defines a pad token id"
                )
            return
        if model_pad is not None and model_pad != tokenizer_pad:
            logger.warning("RewardTrainer: model pad_token_id %s -> tokenizer's %s", model_pad, tokenizer_pad)
        config.pad_token_id = tokenizer_pad

    def _prepare(self, dataset: Any, tokenizer: Any, args: RewardConfig, arg: str) -> Any:
        if dataset is None:
            return None
        if not hasattr(dataset, "column_names"):
            return dataset  # a custom torch dataset: the caller owns its format
        prepared, counts = prepare_reward_dataset(
            dataset, tokenizer, args.max_length, args.overlong_policy, args.dataset_num_proc, arg=arg,
            keep_trl0_layout=self._given_collator is not None,
        )  # fmt: skip
        self.overlong_counts[arg] = counts
        return prepared

    def score_pairs(
        self, model: nn.Module, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rewards_chosen (B,), rewards_rejected (B,)) from one forward pass over both sides."""
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        pad = 0 if pad is None else pad
        if "input_ids_chosen" in inputs:
            n = inputs["input_ids_chosen"].shape[0]
            ids = cat_padded(inputs["input_ids_chosen"], inputs["input_ids_rejected"], pad)
            mask = cat_padded(inputs["attention_mask_chosen"], inputs["attention_mask_rejected"], 0)
        else:  # TRL 1.x's DataCollatorForPreference: chosen rows, then rejected rows, stacked already
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            n = ids.shape[0] // 2
        scores = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # no KV cache to keep
        if scores.dim() != 2 or scores.shape[-1] != 1:
            raise ValueError(
                f"RewardTrainer: the model must output one score per sequence (logits (B, 1)); got "
                f"{tuple(scores.shape)}. Use AutoModelForSequenceClassification with num_labels=1"
            )
        scores = scores[:, 0]
        return scores[:n], scores[n:]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # 1. score chosen and rejected sequences
        rewards_chosen, rewards_rejected = self.score_pairs(model, inputs)
        # 2. Bradley-Terry loss (+ optional centring)
        loss = pairwise_reward_loss(
            rewards_chosen, rewards_rejected, inputs.get("margin"), self.args.center_rewards_coefficient
        )
        # 3. remember the batch statistics for the next log line
        split = "train" if model.training else "eval"
        rc, rr = rewards_chosen.detach().float(), rewards_rejected.detach().float()
        self._metrics.add(
            split,
            {
                "rewards/chosen": rc.mean(),
                "rewards/rejected": rr.mean(),
                "rewards/margins": (rc - rr).mean(),
                "rewards/accuracies": (rc > rr).float().mean(),
            },
        )
        if return_outputs:
            return loss, {"rewards_chosen": rewards_chosen, "rewards_rejected": rewards_rejected}
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        loss = loss.detach()
        if prediction_loss_only:
            return loss, None, None
        logits = torch.stack([outputs["rewards_chosen"], outputs["rewards_rejected"]], dim=1).detach()
        labels = torch.zeros(logits.shape[0], device=logits.device)
        return loss, logits, labels

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        split = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if split == "eval" else ""
        logs.update(self._metrics.pop_means(split, prefix=prefix, accelerator=self.accelerator))
        super().log(logs, start_time)
