"""KTOTrainer: Kahneman-Tversky optimisation (Ethayarajh et al. 2024) on unpaired, labelled completions.

Each row is a prompt and one completion, labelled desirable or undesirable; no pairs are needed. A step:
  1. the policy's summed log-probs of each row's completion;
  2. the reference's, of the same completions and of the mismatched KL pairs (each prompt followed by
     another row's completion), or their precomputed values;
  3. the reference point z: the mean policy/reference log-ratio of the KL pairs, clamped at 0, no gradient
     (loss_type "kto" only);
  4. the loss of `rlhfkit.core.kto.kto_loss`: 1 - sigmoid(beta (r - z)) for a desirable row,
     1 - sigmoid(beta (z - r)) for an undesirable one, weighted, averaged over the batch.
The forward passes are DPO's (`rlhfkit.trainers.dpo.forward`), over KTO's "completion" and "KL" rows; the
reference is `choose_reference`'s, as for DPO.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from rlhfkit.core.kto import (
    KTO_LOSSES_WITH_REFERENCE_POINT,
    balanced_weight_ranges,
    kto_loss,
    kto_reference_point,
)
from rlhfkit.data.unpaired import DataCollatorForUnpairedPreference, prepare_kto_dataset
from rlhfkit.models.adapters import REFERENCE_ADAPTER_NAME, add_reference_adapter
from rlhfkit.models.peft_detection import peft_model_of
from rlhfkit.models.reference import Reference, choose_reference
from rlhfkit.trainers.common import trainer_setup
from rlhfkit.trainers.common.reference_holder import ReferenceHolder, SyncReferenceCallback
from rlhfkit.trainers.common.trainer_setup import MetricBuffer, OfflineTrainer, load_model, load_policy
from rlhfkit.trainers.dpo.forward import ForwardMethods
from rlhfkit.trainers.kto.config import KTOConfig

logger = logging.getLogger(__name__)

LABEL_PAD = -100  # label of the positions that carry no loss (prompt, padding)


class KTOTrainer(ReferenceHolder, ForwardMethods, OfflineTrainer):
    """`transformers.Trainer` for KTO, called as TRL 1.x's `KTOTrainer`.

    `ref_model=None` means: for a PEFT policy given with `peft_config`, the policy with its adapters
    disabled; for a PEFT model given already wrapped, a frozen copy of its adapter as it was at the start;
    otherwise a frozen copy of the initial policy (`choose_reference`).
    """

    config_class = KTOConfig
    default_output_dir = "kto_model"
    model_tag = "kto"
    # compute_loss returns a per-row mean, so Trainer must divide by the accumulation steps itself
    loss_is_scaled_for_ga = False

    def __init__(
        self,
        model: nn.Module | str | None = None,
        ref_model: nn.Module | str | None = None,
        args: KTOConfig | None = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        compute_metrics: Callable | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
    ):
        """TRL 1.x's arguments in its order; `quantization_config` applies to a model given as a path."""
        if train_dataset is None:
            raise ValueError("KTOTrainer: `train_dataset` is required")
        self._ref_model_argument, self._quantization_config = ref_model, quantization_config
        super().__init__(
            model, args, data_collator, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processing_class, compute_metrics=compute_metrics, callbacks=callbacks,
            optimizers=optimizers, peft_config=peft_config,
        )  # fmt: skip
        if self.ref_model is not None:
            self.ref_model = self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)
        if self.args.sync_ref_model:
            self.add_callback(SyncReferenceCallback(self))

    def _setup(self, model: Any, args: KTOConfig, processing_class: Any, peft_config: Any) -> tuple[Any, Any]:
        ref_model, quantization = self._ref_model_argument, self._quantization_config
        del self._ref_model_argument, self._quantization_config
        if processing_class is None:
            raise ValueError("KTOTrainer: give `processing_class` (a tokenizer) to tokenise and pad the data")
        trainer_setup.set_special_tokens(processing_class, "KTOTrainer")  # pad falls back to eos
        if processing_class.pad_token_id is None:
            raise ValueError(
                "KTOTrainer: the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token"
            )
        init_kwargs = args.from_pretrained_kwargs()
        if quantization is not None:
            if not isinstance(model, str):
                raise ValueError(
                    "KTOTrainer: `quantization_config` applies only to a model given as a path; this "
                    "model is already loaded"
                )
            init_kwargs["quantization_config"] = quantization
        was_peft = peft_model_of(model) is not None
        model = load_policy(model, AutoModelForCausalLM, init_kwargs, peft_config, "KTOTrainer", args.seed)
        self.reference = self._build_reference(model, ref_model, args, was_peft and peft_config is None)
        if args.disable_dropout:
            trainer_setup.disable_dropout(model)
            trainer_setup.disable_dropout(self.ref_model)
        self.padding_value = int(processing_class.pad_token_id)
        self.label_pad_token_id = LABEL_PAD
        self.beta, self.loss_type = args.beta, args.loss_type
        self.uses_reference_point = args.loss_type in KTO_LOSSES_WITH_REFERENCE_POINT
        self._metrics = MetricBuffer()
        self._total_train_tokens = 0
        return model, args

    @staticmethod
    def _build_reference(model: Any, ref_model: Any, args: KTOConfig, keep_adapter: bool) -> Reference:
        """`choose_reference`; a PEFT model given already wrapped first keeps a frozen copy of its adapter,
        so the reference is the policy as it starts, not the bare base model."""
        if ref_model is not None and ref_model is model:
            raise ValueError(
                "KTOTrainer: `ref_model` must not be the policy itself; pass None for a frozen copy"
            )
        ref_model = load_model(ref_model, AutoModelForCausalLM, args.from_pretrained_kwargs(), "KTOTrainer")
        peft_model = peft_model_of(model)
        if ref_model is None and keep_adapter and REFERENCE_ADAPTER_NAME not in peft_model.peft_config:
            add_reference_adapter(peft_model, source_adapter=peft_model.active_adapter)
        reference = choose_reference(model, ref_model)
        if args.sync_ref_model and reference.kind != "model":
            raise ValueError(
                "KTOTrainer: sync_ref_model needs a separate reference model; a PEFT policy's reference "
                "lives inside it. Pass a `ref_model` or turn sync_ref_model off"
            )
        return reference

    def _prepare(self, dataset: Any, tokenizer: Any, args: KTOConfig, arg: str) -> Any:
        if dataset is None or not hasattr(dataset, "column_names"):
            return dataset
        block = args.per_device_train_batch_size if self.uses_reference_point else None
        dataset = prepare_kto_dataset(
            dataset, tokenizer, args.max_length, block, args.dataset_num_proc, arg=arg
        )
        if arg == "train_dataset":
            self._check_balance(dataset["label"], args)
        return dataset

    @staticmethod
    def _check_balance(labels: list[bool], args: KTOConfig) -> None:
        """Warn when one kind of row is missing, or the weights are outside the paper's range (its Eq. 8)."""
        n_desirable = sum(labels)
        n_undesirable = len(labels) - n_desirable
        if not n_desirable or not n_undesirable:
            kind = "desirable" if n_desirable else "undesirable"
            logger.warning(
                "KTOTrainer: every row of train_dataset is %s; only the %s loss trains (rewards/%s is "
                "never logged)",
                kind, kind, "rejected" if n_desirable else "chosen",
            )  # fmt: skip
            return
        desirable, undesirable = balanced_weight_ranges(
            n_desirable, n_undesirable, args.desirable_weight, args.undesirable_weight
        )
        in_range = desirable[0] <= args.desirable_weight <= desirable[1] or (
            undesirable[0] <= args.undesirable_weight <= undesirable[1]
        )
        if n_desirable != n_undesirable and not in_range:
            logger.warning(
                "KTOTrainer: %d desirable and %d undesirable rows; the KTO paper recommends EITHER "
                "desirable_weight in [%s, %s] OR undesirable_weight in [%s, %s] (not both)",
                n_desirable, n_undesirable, *desirable, *undesirable,
            )  # fmt: skip

    def _default_collator(self, args: KTOConfig, processing_class: Any) -> Callable:
        return DataCollatorForUnpairedPreference(self.padding_value, args.max_length, args.pad_to_multiple_of)

    # --- log-probs --------------------------------------------------------------------------------------

    def _sides(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The collator's batch as `sides_logps` reads it: "completion" rows and, when present, "KL" rows,
        with labels that hold the completion tokens only."""
        sides = {}
        for side, prefix in (("completion", ""), ("KL", "KL_")):
            if f"{prefix}input_ids" in batch:
                ids, mask = batch[f"{prefix}input_ids"], batch[f"{prefix}completion_mask"]
                sides[f"{side}_input_ids"] = ids
                sides[f"{side}_attention_mask"] = batch[f"{prefix}attention_mask"]
                sides[f"{side}_labels"] = ids.masked_fill(mask == 0, self.label_pad_token_id)
        return sides

    def reference_logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ref_logps (B,), ref_KL_logps (B,) or None without a reference point): precomputed or no-grad."""
        if "ref_logps" in batch:
            return batch["ref_logps"], batch.get("ref_KL_logps")
        sides = ("completion", "KL") if self.uses_reference_point else ("completion",)
        with torch.no_grad(), self._reference() as ref:
            logps, _ = self.sides_logps(ref, self._sides(batch), sides)
        return logps[0], (logps[1] if self.uses_reference_point else None)

    # --- loss and metrics -------------------------------------------------------------------------------

    def _loss_metrics_rewards(
        self, model: nn.Module, batch: dict[str, torch.Tensor], split: str
    ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """(mean loss, metrics, per-row rewards (B,)) for one batch."""
        sides, labels = self._sides(batch), batch["label"].bool()
        # 1. policy log-probs of each row's completion, and their mean logits for the logs
        with self.router_aux.collect(model) as router_losses:  # a mixture-of-experts model's balancing loss
            (policy_logps,), (mean_logits,) = self.sides_logps(model, sides, ("completion",), True)
        # 2. reference log-probs of the completions and of the mismatched KL pairs
        ref_logps, ref_kl_logps = self.reference_logps(batch)
        # 3. the reference point z: the KL pairs' mean log-ratio, clamped at 0, no gradient
        z = policy_logps.new_zeros(())
        if self.uses_reference_point:
            if "KL_input_ids" not in batch:
                raise ValueError("KTOTrainer: loss_type='kto' needs the KL_* columns of the collated batch")
            with torch.no_grad():
                (policy_kl_logps,), _ = self.sides_logps(model, sides, ("KL",))
            z = kto_reference_point(policy_kl_logps, ref_kl_logps, gather=self.accelerator.gather)
        # 4. the KTO loss and the implicit rewards beta * (log pi - log ref)
        args = self.args
        losses, rewards = kto_loss(
            policy_logps, ref_logps, labels, z, beta=self.beta, loss_type=self.loss_type,
            desirable_weight=args.desirable_weight, undesirable_weight=args.undesirable_weight,
        )  # fmt: skip
        metrics = self._batch_metrics(batch, sides, labels, policy_logps, rewards, mean_logits, z, split)
        prefix = "eval_" if split == "eval" else ""
        loss, router_metrics = self.router_aux.add(losses.mean(), router_losses, prefix=prefix)
        return loss, {**metrics, **router_metrics}, rewards

    def _batch_metrics(self, batch, sides, labels, policy_logps, rewards, mean_logits, z, split):
        """TRL's metric names, each a mean over the rows (logits: over the tokens) of every process."""
        tokens = (sides["completion_labels"][:, 1:] != self.label_pad_token_id).sum(1).float()
        chosen, rejected = labels.float(), (~labels).float()
        sums = torch.stack([
            chosen.sum(), rejected.sum(),
            (rewards * chosen).sum(), (rewards * rejected).sum(),
            (policy_logps.detach() * chosen).sum(), (policy_logps.detach() * rejected).sum(),
            (mean_logits * tokens * chosen).sum(), (tokens * chosen).sum(),
            (mean_logits * tokens * rejected).sum(), (tokens * rejected).sum(),
            batch["attention_mask"].sum().float(),
        ]).float()  # fmt: skip
        n_c, n_r, r_c, r_r, lp_c, lp_r, lg_c, t_c, lg_r, t_r, n_tokens = (
            self.accelerator.gather(sums[None]).sum(0).tolist()
        )
        prefix = "eval_" if split == "eval" else ""
        metrics = {f"{prefix}kl": float(z)}
        if n_c:
            metrics |= {f"{prefix}rewards/chosen": r_c / n_c, f"{prefix}logps/chosen": lp_c / n_c}
        if n_r:
            metrics |= {f"{prefix}rewards/rejected": r_r / n_r, f"{prefix}logps/rejected": lp_r / n_r}
        if n_c and n_r:
            metrics[f"{prefix}rewards/margins"] = r_c / n_c - r_r / n_r
        if t_c:
            metrics[f"{prefix}logits/chosen"] = lg_c / t_c
        if t_r:
            metrics[f"{prefix}logits/rejected"] = lg_r / t_r
        if split == "train":
            self._total_train_tokens += int(n_tokens)
        return metrics

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        split = "train" if model.training else "eval"
        loss, metrics, rewards = self._loss_metrics_rewards(model, inputs, split)
        self._metrics.add(split, metrics)
        return (loss, {"rewards": rewards}) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """(loss, per-row rewards, labels as 0/1): what `compute_metrics` receives."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss, metrics, rewards = self._loss_metrics_rewards(model, inputs, "eval")
        self._metrics.add("eval", metrics)
        if prediction_loss_only:
            return loss.detach(), None, None
        return loss.detach(), rewards, inputs["label"].float()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        split = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        logs.update(self._metrics.pop_means(split, accelerator=self.accelerator))
        if split == "train" and "loss" in logs:  # a training step's log, not the closing summary
            logs["num_tokens"] = float(self._total_train_tokens)
        super().log(logs, start_time)

    # --- reference precomputation and syncing -----------------------------------------------------------

    def _with_reference_logps(self, dataset: Any, batch_size: int) -> Any:
        """Add the `ref_logps` (and `ref_KL_logps`) columns, computed once, in the dataset's order."""
        if dataset is None or not hasattr(dataset, "add_column") or "ref_logps" in dataset.column_names:
            return dataset
        loader = DataLoader(dataset, batch_size=batch_size, collate_fn=self.data_collator)
        columns: dict[str, list[float]] = {"ref_logps": [], "ref_KL_logps": []}
        for batch in loader:
            logps, kl_logps = self.reference_logps(self._prepare_inputs(batch))
            columns["ref_logps"] += logps.float().cpu().tolist()
            if kl_logps is not None:
                columns["ref_KL_logps"] += kl_logps.float().cpu().tolist()
        for name, values in columns.items():
            if values:
                dataset = dataset.add_column(name, values)
        return dataset

    def _precompute_all(self) -> None:
        args = self.args
        size = args.precompute_ref_batch_size
        self.train_dataset = self._with_reference_logps(
            self.train_dataset, size or args.per_device_train_batch_size
        )
        eval_size = size or args.per_device_eval_batch_size
        if isinstance(self.eval_dataset, dict):
            self.eval_dataset = {
                k: self._with_reference_logps(v, eval_size) for k, v in self.eval_dataset.items()
            }
        else:
            self.eval_dataset = self._with_reference_logps(self.eval_dataset, eval_size)

    def get_train_dataloader(self) -> DataLoader:
        if self.args.precompute_ref_log_probs:
            self._precompute_all()
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        if hasattr(eval_dataset, "column_names") and "prompt_ids" not in eval_dataset.column_names:
            # a raw dataset passed to evaluate(): prepared as the eval_dataset given at construction is
            eval_dataset = self._prepare(eval_dataset, self.processing_class, self.args, "eval_dataset")
        if self.args.precompute_ref_log_probs:
            self._precompute_all()
            if eval_dataset is not None and not isinstance(eval_dataset, str):
                size = self.args.precompute_ref_batch_size or self.args.per_device_eval_batch_size
                eval_dataset = self._with_reference_logps(eval_dataset, size)
        return super().get_eval_dataloader(eval_dataset)
