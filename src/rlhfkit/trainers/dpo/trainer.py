"""DPOTrainer: direct preference optimisation, no reward model and no sampling during training.

For each pair (prompt, chosen, rejected) the loss compares how much more the policy prefers chosen
over rejected than the frozen reference does:
    logits = [log pi(c) - log pi(r)] - [log ref(c) - log ref(r)],   loss = f(beta * logits)
with f chosen by `loss_type` (sigmoid = DPO, hinge = SLiC, ipo = IPO, ... TRL's menu, or a weighted list
of them) in `rlhfkit.core.losses`.
The reference is a frozen copy of the policy, or, for a PEFT policy, the same network with its
frozen SFT reference adapter active or its adapters switched off; its log-probs can also be computed once
up front (precompute_ref_log_probs). The forward passes are in `rlhfkit.trainers.dpo.forward`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, TrainingArguments

from rlhfkit.core.losses import dpo_loss
from rlhfkit.data.collators import DataCollatorForPreference, DPODataCollatorWithPadding, pad_sequences
from rlhfkit.data.preference import prepare_dpo_dataset
from rlhfkit.models.reference import Reference, choose_reference
from rlhfkit.trainers.common import trainer_setup
from rlhfkit.trainers.common.reference_holder import ReferenceHolder, SyncReferenceCallback
from rlhfkit.trainers.common.trainer_setup import MetricBuffer, OfflineTrainer, load_model, load_policy
from rlhfkit.trainers.dpo.config import DPOConfig
from rlhfkit.trainers.dpo.forward import ForwardMethods, pair_count

logger = logging.getLogger(__name__)

__all__ = ["DPOTrainer", "DataCollatorForPreference", "SyncReferenceCallback"]


class DPOTrainer(ReferenceHolder, ForwardMethods, OfflineTrainer):
    """`transformers.Trainer` for DPO; TRL 0.x's keyword arguments override the matching `args` fields.

    `ref_model=None` means, for a PEFT policy (or when `peft_config` is given): its frozen SFT
    `reference` adapter if it has one, else the policy with adapters disabled; otherwise a frozen copy
    of the initial policy (`choose_reference`). With `reference_free` no reference is used at all.
    TRL 0.x's `tokenizer=` is another name for `processing_class=`.
    """

    config_class = DPOConfig
    default_output_dir = "dpo_model"
    model_tag = "dpo"
    override_keywords = (
        "beta", "label_pad_token_id", "padding_value", "truncation_mode", "max_length", "max_prompt_length",
        "disable_dropout",
    )  # fmt: skip
    # compute_loss returns a per-pair mean, so Trainer must divide by the accumulation steps itself
    loss_is_scaled_for_ga = False

    def __init__(
        self,
        model: nn.Module | str | None = None,
        ref_model: nn.Module | str | None = None,
        beta: float | None = None,
        args: DPOConfig | None = None,
        data_collator: Callable | None = None,
        label_pad_token_id: int | None = None,
        padding_value: int | None = None,
        truncation_mode: str | None = None,
        **kwargs: Any,
    ):
        """TRL 0.x's leading arguments in its order; the rest (train_dataset=, processing_class=/tokenizer=,
        max_length=, peft_config=, compute_metrics=, ...) by keyword, as `OfflineTrainer` takes them."""
        self._ref_model_argument = ref_model
        if isinstance(beta, TrainingArguments):  # TRL 1.x's positional order: shift the slots back
            shifted = (args, data_collator, label_pad_token_id, padding_value, truncation_mode)
            names = ("data_collator", "train_dataset", "eval_dataset", "processing_class", "compute_metrics")
            for name, value in zip(names[1:], shifted[1:]):
                if value is not None:
                    if kwargs.get(name) is not None:
                        raise TypeError(f"DPOTrainer got two values for {name!r} (by position and keyword)")
                    kwargs[name] = value
            args, data_collator, beta = beta, shifted[0], None
            label_pad_token_id = padding_value = truncation_mode = None
        super().__init__(
            model,
            args,
            data_collator,
            beta=beta,
            label_pad_token_id=label_pad_token_id,
            padding_value=padding_value,
            truncation_mode=truncation_mode,
            **kwargs,
        )
        if self.ref_model is not None:
            self.ref_model = self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)
        if self.args.sync_ref_model:
            self.add_callback(SyncReferenceCallback(self))

    def _setup(self, model: Any, args: DPOConfig, processing_class: Any, peft_config: Any) -> tuple[Any, Any]:
        owner, ref_model = type(self).__name__, self._ref_model_argument
        del self._ref_model_argument
        if model is None and ref_model is None and not args.reference_free:
            # the default reference is a copy of `model`, which model_init only builds later
            raise ValueError(
                f"{owner}: with `model_init` and no `model`, pass `ref_model` or reference_free=True"
            )
        trainer_setup.set_special_tokens(processing_class, owner, pad_token=args.pad_token)
        if args.padding_free:
            logger.warning(
                "%s: padding_free=True is not applied (as in TRL 1.16, where it is temporarily disabled); "
                "the batches stay padded",
                owner,
            )
        model = load_policy(
            model, AutoModelForCausalLM, args.from_pretrained_kwargs(), peft_config, owner, args.seed
        )
        self.reference = self._build_reference(model, ref_model, args)
        if args.sync_ref_model and (self.reference is None or self.reference.kind != "model"):
            raise ValueError(
                f"{owner}: sync_ref_model mixes the policy into a separate reference model; a PEFT policy's "
                "reference is its own base weights (or adapter), so there is nothing to sync"
            )
        if args.disable_dropout:
            trainer_setup.disable_dropout(model)
            trainer_setup.disable_dropout(self.ref_model)

        self.padding_value = self._padding_value(args, processing_class)
        self.label_pad_token_id = args.label_pad_token_id
        self.beta = args.beta
        self.loss_type = args.loss_type
        self.ld_alpha = args.ld_alpha
        self._metrics = MetricBuffer()
        self.eval_samples: list[dict[str, str]] = []
        return model, args

    def _default_collator(self, args: DPOConfig, processing_class: Any) -> Callable:
        return DPODataCollatorWithPadding(
            self.padding_value, self.label_pad_token_id, args.pad_to_multiple_of
        )

    @staticmethod
    def _padding_value(args: DPOConfig, processing_class: Any) -> int:
        """`padding_value`, else the tokenizer's pad token (`__init__` has set it to eos when missing)."""
        pad = args.padding_value
        if pad is None:
            if processing_class is None:
                raise ValueError(
                    "DPOTrainer: give `processing_class` (or `tokenizer`) or `padding_value` to pad the "
                    "batches"
                )
            pad = processing_class.pad_token_id
            if pad is None:
                raise ValueError(
                    "DPOTrainer: the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token "
                    "or pass padding_value"
                )
        return int(pad)

    @staticmethod
    def _build_reference(model: Any, ref_model: Any, args: DPOConfig) -> Reference | None:
        """`choose_reference`: explicit model > the PEFT policy's frozen SFT adapter > its adapter-free
        base > a frozen copy. None when there is nothing to refer to (reference_free, or no model yet)."""
        if ref_model is not None and ref_model is model:
            raise ValueError(
                "DPOTrainer: `ref_model` must not be the policy itself; pass None for a frozen copy"
            )
        ref_model = load_model(ref_model, AutoModelForCausalLM, args.from_pretrained_kwargs(), "DPOTrainer")
        if ref_model is None and (model is None or args.reference_free):
            return None
        return choose_reference(model, ref_model)

    @staticmethod
    def _prepare(dataset: Any, tokenizer: Any, args: DPOConfig, arg: str) -> Any:
        if dataset is None or not hasattr(dataset, "column_names"):
            return dataset
        if args.precompute_ref_log_probs and not hasattr(dataset, "__len__"):  # a datasets.IterableDataset
            raise ValueError(
                f"DPOTrainer: precompute_ref_log_probs needs a map-style datasets.Dataset as `{arg}`, not an "
                "iterable one (its rows cannot be given new columns); set precompute_ref_log_probs=False"
            )
        return prepare_dpo_dataset(
            dataset,
            tokenizer,
            args.max_length,
            args.max_prompt_length,
            args.truncation_mode,
            args.dataset_num_proc,
            arg=arg,
        )

    # --- the reference ------------------------------------------------------------------------------

    def reference_logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ref_chosen_logps, ref_rejected_logps), (B,) each: precomputed, zeros, or a no-grad forward."""
        for prefix in ("reference", "ref"):  # rlhfkit's / TRL 0.x's columns, TRL 1.x's
            if f"{prefix}_chosen_logps" in batch:
                return batch[f"{prefix}_chosen_logps"], batch[f"{prefix}_rejected_logps"]
        if self.args.reference_free:
            device = self.concatenated_inputs(batch)["concatenated_input_ids"].device
            zeros = torch.zeros(pair_count(batch), device=device)
            return zeros, zeros
        with torch.no_grad(), self._reference() as ref:
            chosen, rejected, _, _ = self._concatenated_logps(ref, batch)
        return chosen, rejected

    # --- loss and metrics ---------------------------------------------------------------------------

    def dpo_loss(
        self,
        policy_chosen_logps: torch.Tensor,
        policy_rejected_logps: torch.Tensor,
        reference_chosen_logps: torch.Tensor,
        reference_rejected_logps: torch.Tensor,
        reference_free: bool = False,
        chosen_lengths: torch.Tensor | None = None,
        rejected_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(losses, chosen_rewards, rejected_rewards), (B,) each, from `rlhfkit.core.losses.dpo_loss`; the
        completion lengths are what "ipo", "sigmoid_norm" and "sft" average over."""
        args = self.args
        return dpo_loss(
            policy_chosen_logps,
            policy_rejected_logps,
            reference_chosen_logps,
            reference_rejected_logps,
            beta=self.beta,
            loss_type=self.loss_type,
            label_smoothing=args.label_smoothing,
            reference_free=reference_free or args.reference_free,
            loss_weights=args.loss_weights,
            chosen_lengths=chosen_lengths,
            rejected_lengths=rejected_lengths,
            f_divergence_type=args.f_divergence_type,
            f_alpha_divergence_coef=args.f_alpha_divergence_coef,
            discopop_tau=args.discopop_tau,
        )

    def get_batch_metrics(
        self, model: nn.Module, batch: dict[str, torch.Tensor], train_eval: str = "train"
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(mean loss, metrics) for one batch, as in TRL 0.x; metric names get `eval_` for "eval".

        Training steps call this method, so a subclass may override it.
        """
        loss, metrics, _ = self._loss_metrics_rewards(model, batch, train_eval)
        return loss, metrics

    def _loss_metrics_rewards(
        self, model: nn.Module, batch: dict[str, torch.Tensor], train_eval: str
    ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """`get_batch_metrics` plus the per-pair implicit rewards (B, 2) [chosen, rejected]."""
        # 1. policy log-probs of both responses, their logged mean logits (and WPO weights), one forward pass
        with self.router_aux.collect(model) as router_losses:  # a mixture-of-experts model's balancing loss
            weighted = self.args.use_weighting
            policy = self._scored_pass(model, batch, with_mean_logits=True, with_weights=weighted)
        policy_chosen, policy_rejected = policy.chosen, policy.rejected
        # 2. reference log-probs (precomputed, or a no-grad forward)
        ref_chosen, ref_rejected = self.reference_logps(batch)
        # 3. DPO loss and implicit rewards beta * (log pi - log ref); WPO reweights each pair's loss
        labels = self.concatenated_inputs(batch)["concatenated_labels"]
        lengths = (labels[:, 1:] != self.label_pad_token_id).sum(1).chunk(2)  # completion tokens per row
        losses, chosen_rewards, rejected_rewards = self.dpo_loss(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected, False, *lengths
        )
        if policy.weights is not None:
            losses = losses * policy.weights
        # 4. metrics
        prefix = "eval_" if train_eval == "eval" else ""
        metrics = {
            f"{prefix}rewards/chosen": chosen_rewards.mean().item(),
            f"{prefix}rewards/rejected": rejected_rewards.mean().item(),
            f"{prefix}rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
            f"{prefix}rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
            f"{prefix}logps/chosen": policy_chosen.detach().mean().item(),
            f"{prefix}logps/rejected": policy_rejected.detach().mean().item(),
            f"{prefix}logits/chosen": policy.mean_chosen.mean().item(),
            f"{prefix}logits/rejected": policy.mean_rejected.mean().item(),
        }
        loss, router_metrics = self.router_aux.add(losses.mean(), router_losses, prefix=prefix)
        return loss, {**metrics, **router_metrics}, torch.stack([chosen_rewards, rejected_rewards], dim=1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        split = "train" if model.training else "eval"
        if not return_outputs:
            loss, metrics = self.get_batch_metrics(model, inputs, split)
            self._metrics.add(split, metrics)
            return loss
        loss, metrics, rewards = self._loss_metrics_rewards(model, inputs, split)
        self._metrics.add(split, metrics)
        return loss, {"rewards": rewards}

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss, metrics, rewards = self._loss_metrics_rewards(model, inputs, "eval")
        self._metrics.add("eval", metrics)
        if prediction_loss_only:
            return loss.detach(), None, None
        return loss.detach(), rewards, torch.zeros(rewards.shape[0], device=rewards.device)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        split = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        logs.update(self._metrics.pop_means(split, accelerator=self.accelerator))
        super().log(logs, start_time)

    # --- reference precomputation -------------------------------------------------------------------

    def _with_reference_logps(self, dataset: Any, split: str = "eval") -> Any:
        """Add reference_chosen_logps / reference_rejected_logps columns, computed once, in batches of
        precompute_ref_batch_size (default: the split's per-device batch size)."""
        if dataset is None or not hasattr(dataset, "add_column") or not hasattr(dataset, "__len__"):
            # a custom torch dataset (its rows are the caller's); `_prepare` refused iterable ones
            return dataset
        if {"reference_chosen_logps", "ref_chosen_logps"} & set(dataset.column_names):
            return dataset
        args = self.args
        default = args.per_device_train_batch_size if split == "train" else args.per_device_eval_batch_size
        loader = DataLoader(
            dataset, batch_size=args.precompute_ref_batch_size or default, collate_fn=self.data_collator
        )
        chosen, rejected = [], []
        for batch in loader:
            batch = self._prepare_inputs(batch)
            c, r = self.reference_logps(batch)
            chosen += c.float().cpu().tolist()
            rejected += r.float().cpu().tolist()
        return dataset.add_column("reference_chosen_logps", chosen).add_column(
            "reference_rejected_logps", rejected
        )

    def _precompute_all(self) -> None:
        self.train_dataset = self._with_reference_logps(self.train_dataset, "train")
        if isinstance(self.eval_dataset, dict):
            self.eval_dataset = {k: self._with_reference_logps(v) for k, v in self.eval_dataset.items()}
        else:
            self.eval_dataset = self._with_reference_logps(self.eval_dataset)

    def get_train_dataloader(self) -> DataLoader:
        if self.args.precompute_ref_log_probs and not self.args.reference_free:
            self._precompute_all()
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        if self.args.precompute_ref_log_probs and not self.args.reference_free:
            self._precompute_all()
            if eval_dataset is not None and not isinstance(eval_dataset, str):
                eval_dataset = self._with_reference_logps(eval_dataset)
        return super().get_eval_dataloader(eval_dataset)

    # --- samples --------------------------------------------------------------------------------------

    def get_batch_samples(self, *args: Any, **kwargs: Any):
        """Seed API `get_batch_samples(model, batch) -> (policy_texts, reference_texts)`.

        transformers.Trainer uses the same name for `(epoch_iterator, num_batches, device)`;
        calls of that form are passed on to it unchanged.
        """
        first = args[0] if args else kwargs.get("model")
        if not isinstance(first, nn.Module):
            return super().get_batch_samples(*args, **kwargs)
        model = first
        batch = args[1] if len(args) > 1 else kwargs["batch"]
        return self._generate_samples(model, batch)

    @torch.no_grad()
    def _generate_samples(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[list[str], list[str]]:
        prompt_ids, prompt_mask = self._prompt_batch(batch)
        gen = {
            "attention_mask": prompt_mask,
            "max_new_tokens": self.args.max_new_tokens_eval,
            "do_sample": True,
            "pad_token_id": self.padding_value,
        }
        unwrapped = self.accelerator.unwrap_model(model)
        policy = unwrapped.generate(input_ids=prompt_ids, **gen)
        if self.args.reference_free:
            reference = policy
        else:
            with self._reference() as ref:
                reference = self.accelerator.unwrap_model(ref).generate(input_ids=prompt_ids, **gen)
        width = prompt_ids.shape[1]
        decode = self.processing_class.batch_decode
        return (
            decode(policy[:, width:], skip_special_tokens=True),
            decode(reference[:, width:], skip_special_tokens=True),
        )

    def _prompt_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt ids, mask), left-padded for generation; TRL 1.x's batches hold the prompt only inside
        input_ids (the real, non-completion tokens of the chosen rows)."""
        if "prompt_input_ids" in batch:
            return batch["prompt_input_ids"], batch["prompt_attention_mask"]
        n = pair_count(batch)
        keep = (batch["attention_mask"][:n] == 1) & (batch["completion_mask"][:n] == 0)
        prompts = [row[k].tolist() for row, k in zip(batch["input_ids"][:n], keep)]
        device = batch["input_ids"].device
        ids = pad_sequences(prompts, self.padding_value, "left").to(device)
        return ids, pad_sequences([[1] * len(p) for p in prompts], 0, "left").to(device)

    def evaluation_loop(self, dataloader, *args: Any, **kwargs: Any):
        output = super().evaluation_loop(dataloader, *args, **kwargs)
        if self.args.generate_during_eval and self.processing_class is not None:
            batch = self._prepare_inputs(next(iter(dataloader)))
            policy, reference = self._generate_samples(self.model, batch)
            prompts = self.processing_class.batch_decode(
                self._prompt_batch(batch)[0], skip_special_tokens=True
            )
            self.eval_samples = [
                {"prompt": p, "policy": a, "reference": b} for p, a, b in zip(prompts, policy, reference)
            ]
            for sample in self.eval_samples[:4]:
                logger.info("DPO sample | prompt: %r | policy: %r | reference: %r", *sample.values())
        return output
