"""SFTTrainer: supervised fine-tuning (next-token cross-entropy) of a causal language model.

Text comes from a column, a formatting function, prompt/completion columns or a chat column
rendered with the tokenizer's chat template. Examples are padded one per row, concatenated padding-free,
or packed (TRL 1.x's best-fit-decreasing / wrapped rows, or TRL 0.x's `ConstantLengthDataset` blocks);
position ids restart at every document so that supporting models never attend across documents. With
`completion_only_loss` / `assistant_only_loss` only completion / assistant tokens are trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rlhfkit.data.chat_templates import apply_chat_template_path
from rlhfkit.data.language_modeling import DataCollatorForLanguageModeling
from rlhfkit.data.packing import ConstantLengthDataset, pack_dataset
from rlhfkit.data.preparation import check_not_empty, is_iterable_dataset, prepare_sft_dataset
from rlhfkit.rollout.lm_head import find_lm_head
from rlhfkit.rollout.scoring import prefers_chunked_head
from rlhfkit.trainers.common.trainer_setup import (
    MetricBuffer,
    OfflineTrainer,
    apply_overrides,
    load_policy,
    set_special_tokens,
)
from rlhfkit.trainers.sft.config import SFTConfig
from rlhfkit.trainers.sft.token_stats import (
    chunked_label_stats,
    dft_token_losses,
    logits_label_stats,
    logits_token_stats,
)

logger = logging.getLogger(__name__)

# what `_prepare` and the packing produce, for the collators
PREPARED_COLUMNS = (
    "input_ids", "labels", "attention_mask", "position_ids", "completion_mask", "assistant_masks",
    "seq_lengths",
)  # fmt: skip


def packed_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    """Stack packed blocks. No attention_mask on purpose: restarting position_ids define the documents."""
    keys = ("input_ids", "position_ids", "labels")
    return {k: torch.stack([torch.as_tensor(f[k], dtype=torch.long) for f in features]) for k in keys}


@dataclass
class ConstantLengthCollator:
    """`packed_collator` for ConstantLengthDataset blocks; rows that are not blocks (an eval set with
    eval_packing=False) go to `unpacked`."""

    unpacked: Callable

    @property
    def padding_free(self) -> bool:
        """Blocks carry restarting position ids and no attention mask; other rows as `unpacked` does."""
        return bool(getattr(self.unpacked, "padding_free", False))

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        return packed_collator(features) if "position_ids" in features[0] else self.unpacked(features)


class SFTTrainer(OfflineTrainer):
    """`transformers.Trainer` for supervised fine-tuning; TRL 0.x's keyword arguments override `args`.

    `model` may be a local path (loaded with AutoModelForCausalLM and `args.model_init_kwargs`, float32
    unless they name a dtype); `peft_config` wraps it with any PEFT method (LoRA, prompt tuning, ...);
    `formatting_func(example) -> str` builds the text of a row. TRL 0.x's `tokenizer=` is another name for
    `processing_class=`. Datasets may be `datasets.Dataset` or `datasets.IterableDataset`.
    """

    config_class = SFTConfig
    default_output_dir = "sft_model"
    model_tag = "sft"
    override_keywords = (
        "dataset_text_field", "packing", "max_seq_length", "infinite", "num_of_sequences", "chars_per_token",
        "dataset_num_proc", "dataset_batch_size",
    )  # fmt: skip

    def __init__(self, *args: Any, formatting_func: Callable | None = None, **kwargs: Any):
        """The arguments of `OfflineTrainer`, the `override_keywords`, and `formatting_func`."""
        self.formatting_func = formatting_func
        self._metrics = MetricBuffer()
        self._num_tokens = 0
        super().__init__(*args, **kwargs)
        collator = self.data_collator
        if self.args.uses_padding_free() and not getattr(collator, "padding_free", False):
            raise ValueError(
                "SFTTrainer: padding_free=True (or packing with packing_strategy 'bfd'/'bfd_split') needs a "
                f"padding-free collator, and the data_collator given is {type(collator).__name__}; leave "
                "data_collator unset or pass DataCollatorForLanguageModeling(pad_token_id, padding_free=True)"
            )

    def _setup(self, model: Any, args: SFTConfig, processing_class: Any, peft_config: Any) -> tuple[Any, Any]:
        owner = type(self).__name__
        if processing_class is None:
            raise ValueError(f"{owner}: `processing_class` (or `tokenizer`) is required")
        set_special_tokens(processing_class, owner, pad_token=args.pad_token, eos_token=args.eos_token)
        if processing_class.pad_token_id is None:
            raise ValueError(
                f"{owner}: the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token or "
                "SFTConfig(pad_token=...)"
            )
        apply_chat_template_path(processing_class, args.chat_template_path, owner)
        if args.completion_only_loss and self.formatting_func is not None:
            raise ValueError(
                f"{owner}: completion_only_loss=True and a formatting_func were both given; the function "
                "turns each row into one text, which has no completion part. Drop one of them."
            )
        model = load_policy(
            model, AutoModelForCausalLM, args.from_pretrained_kwargs(), peft_config, owner, args.seed
        )
        if args.max_seq_length is None:  # set as max_length: TRL 1.x's packing strategy stays the default
            default_length = min(int(getattr(processing_class, "model_max_length", 1024) or 1024), 1024)
            args = apply_overrides(args, owner, max_length=default_length)
        return model, args

    def _default_collator(self, args: SFTConfig, processing_class: Any) -> Callable:
        collator = DataCollatorForLanguageModeling(
            processing_class.pad_token_id,
            padding_free=args.uses_padding_free(),
            pad_to_multiple_of=args.pad_to_multiple_of,
        )
        if args.packing and args.resolved_packing_strategy() == "constant_length":
            return ConstantLengthCollator(collator)
        return collator

    def _prepare(self, dataset: Any, tokenizer: Any, args: SFTConfig, arg: str) -> Any:
        hf_iterable = is_iterable_dataset(dataset)
        if dataset is None or not (hf_iterable or hasattr(dataset, "column_names")):
            return dataset  # already packed / custom torch dataset: used as given
        if (args.dataset_kwargs or {}).get("skip_prepare_dataset"):
            return dataset  # tokenised by the caller
        if (getattr(dataset, "format", None) or {}).get("type") == "custom":
            # a `with_transform` function runs on read, after preparation has rewritten the columns
            raise ValueError(
                f"SFTTrainer: `{arg}` has a Dataset.with_transform() function, which would run on rows "
                "this trainer has already tokenised; give SFTConfig(dataset_kwargs={'skip_prepare_dataset': "
                "True}) and have the transform return trainer-ready rows (input_ids, labels)"
            )
        check_not_empty(dataset, "SFTTrainer", arg)
        if hf_iterable and getattr(args.accelerator_config, "dispatch_batches", None) is not False:
            # with several processes, dispatching would concatenate batches of different widths
            args.accelerator_config.dispatch_batches = False
        packing = args.packing if arg == "train_dataset" or args.eval_packing is None else args.eval_packing
        strategy = args.resolved_packing_strategy()
        if packing and strategy == "constant_length":
            return self._constant_length(dataset, tokenizer, args, arg)
        formatting = self.formatting_func
        completion_only = args.completion_only_loss  # None: by the columns, except for formatted text
        completion_only = False if formatting is not None and completion_only is None else completion_only
        prepared = prepare_sft_dataset(
            dataset, tokenizer, None if packing else args.max_seq_length, args.dataset_text_field, formatting,
            completion_only,
            num_proc=args.dataset_num_proc, batch_size=args.dataset_batch_size, arg=arg,
            assistant_only_loss=args.assistant_only_loss, truncation_mode=args.truncation_mode,
        )  # fmt: skip
        if args.shuffle_dataset:  # before packing too: documents packed together are then unrelated
            prepared = prepared.shuffle(seed=args.seed)
        if packing:
            map_kwargs = {} if hf_iterable else {"num_proc": args.dataset_num_proc}
            prepared = pack_dataset(prepared, args.max_seq_length, strategy, map_kwargs)
            if args.shuffle_dataset:
                prepared = prepared.shuffle(seed=args.seed)
        return prepared

    def _set_signature_columns_if_needed(self) -> None:
        """With remove_unused_columns=True, keep the prepared columns the collator reads (not all of them are
        forward() arguments): dropping the masks or seq_lengths would silently train on every token."""
        if self._signature_columns is None:
            self._signature_columns = list(PREPARED_COLUMNS)

    def _prepare_raw(self, dataset: Any, arg: str) -> Any:
        """`_prepare`, except for a dataset already tokenised (or packed): used as it is."""
        if "input_ids" in (getattr(dataset, "column_names", None) or []):
            return dataset
        return self._prepare(dataset, self.processing_class, self.args, arg)

    def _constant_length(self, dataset: Any, tokenizer: Any, args: SFTConfig, arg: str) -> Any:
        """TRL 0.x's packing: raw text into ConstantLengthDataset blocks, materialised unless infinite."""
        packed = ConstantLengthDataset(
            tokenizer,
            dataset,
            dataset_text_field=args.dataset_text_field,
            formatting_func=self.formatting_func,
            infinite=args.infinite,
            seq_length=args.max_seq_length,
            num_of_sequences=args.num_of_sequences,
            chars_per_token=args.chars_per_token,
            append_concat_token=args.append_concat_token,
            seed=args.seed,
        )
        if args.infinite:
            return packed
        # a finite packing is materialised, so epochs, lengths and shuffling work as usual
        import datasets

        blocks = [{k: v.tolist() for k, v in block.items()} for block in packed]
        if not blocks:
            raise ValueError(
                f"SFTTrainer: `{arg}` holds fewer tokens than one packed block of max_seq_length="
                f"{args.max_seq_length}; lower max_seq_length or add data"
            )
        logger.info(
            "SFTTrainer: packed %s into %d blocks of %d tokens", arg, len(blocks), args.max_seq_length
        )
        return datasets.Dataset.from_list(blocks)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """transformers' causal-LM loss ('nll') or DFT's; without (B, T, V) logits when they would be large.

        Then the label tokens are scored in chunks from the final hidden states (`rollout.lm_head`), with the
        same reduction as transformers 5: summed and divided by `num_items_in_batch` (the label tokens of the
        whole accumulated batch) when the Trainer passes it to a model that accepts loss kwargs, else a mean
        over this batch's label tokens. Label smoothing, `compute_loss_func`, `return_outputs` (evaluation
        and predictions want the logits) and heads that are not plain linear layers keep the logits path.
        Either way the label tokens' entropy and top-1 accuracy are logged (TRL's `entropy`,
        `mean_token_accuracy`), with the running count of trained-on input tokens (`num_tokens`). A
        mixture-of-experts model's load-balancing loss is added when `router_aux_loss_coef` is on
        (`common.moe`; either path: both run the model's own forward).
        """
        # a training forward needs no KV cache (building one costs memory); for a packed block an empty
        # cache would also hide the document boundaries from the mask builder
        inputs = {**inputs, "use_cache": False}
        self._count_tokens(inputs)
        labels = inputs["labels"]
        forward = {k: v for k, v in inputs.items() if k != "labels"}
        dft = self.args.loss_type == "dft" and not return_outputs
        own_loss = (
            self.label_smoother is None
            and self.compute_loss_func is None
            and "shift_labels" not in inputs
            and not getattr(getattr(self.accelerator, "parallelism_config", None), "sp_enabled", False)
        )
        head = None
        if not return_outputs and own_loss and (dft or prefers_chunked_head(model, labels.numel())):
            head = find_lm_head(model)
        # with the router loss on, labels never reach the model: it would add its own coefficient x aux_loss
        own_logits = dft or (self.router_aux.enabled and own_loss)
        labels_reach_model = self.label_smoother is None and self.compute_loss_func is None
        if self.router_aux.enabled and not own_loss and labels_reach_model:
            raise ValueError(
                "SFTTrainer: router_aux_loss_coef is on, and with sequence parallelism or shift_labels the "
                "model computes the loss from the labels with its own coefficient; set router_aux_loss_coef=0"
            )
        with self.router_aux.collect(model) as router_losses:
            if head is not None:
                logprobs, mask, stats = chunked_label_stats(model, head, labels, forward)
                outputs = None
            elif own_logits:
                outputs = model(**forward)
                logprobs, mask, stats = logits_label_stats(outputs.logits, labels)
            else:
                loss, outputs = super().compute_loss(
                    model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
                )
                logprobs, stats = None, logits_token_stats(outputs.logits, labels)
        self._record(stats)
        if logprobs is not None:
            token_losses = dft_token_losses(logprobs) if dft else -logprobs
            loss = self._token_mean(token_losses, mask, num_items_in_batch)
        loss = self._add_router_loss(loss, router_losses, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _add_router_loss(self, loss: torch.Tensor, router_losses: list, num_items_in_batch: Any):
        """`loss` + coef x the MoE load-balancing loss (`common.moe`), logged as `aux_loss`. That loss is a
        mean over this micro-batch: when the Trainer leaves gradient accumulation to a loss normalised by
        `num_items_in_batch`, it is divided by the accumulation steps so the step averages it."""
        by_items = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        scaled_for_accumulation = self.model.training and (by_items or self.compute_loss_func is not None)
        steps = self.current_gradient_accumulation_steps if scaled_for_accumulation else 1
        loss, metrics = self.router_aux.add(loss, router_losses, scale=1.0 / steps)
        self._metrics.add("train" if self.model.training else "eval", metrics)
        return loss

    def _count_tokens(self, inputs: dict) -> None:
        """TRL's `num_tokens`: input tokens trained on so far (padding excluded), summed over processes."""
        if not self.model.training:
            return
        if "attention_mask" in inputs:
            local = inputs["attention_mask"].sum()
        else:
            local = torch.tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
        self._num_tokens += int(self.accelerator.gather(local.reshape(1)).sum())

    def _record(self, stats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Log this step's entropy and top-1 accuracy over the label tokens of every process (sums gathered,
        then divided, so two processes log what one process with both batches would)."""
        local = torch.stack([torch.as_tensor(x, dtype=torch.float32, device=stats[0].device) for x in stats])
        entropy_sum, hits, count = self.accelerator.gather(local[None]).sum(0).tolist()
        split = "train" if self.model.training else "eval"
        if count > 0:
            self._metrics.add(split, {"entropy": entropy_sum / count, "mean_token_accuracy": hits / count})
        self._metrics.add(split, {"num_tokens": self._num_tokens})

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        split = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if split == "eval" else ""
        logs.update(self._metrics.pop_means(split, prefix=prefix, accelerator=self.accelerator))
        super().log(logs, start_time)

    def _token_mean(self, token_losses, mask, num_items_in_batch):
        """transformers 5's reduction: summed and divided by the label tokens of the whole accumulated batch
        when the Trainer passes them to a model that accepts loss kwargs, else by this batch's."""
        if not (self.model_accepts_loss_kwargs and num_items_in_batch is not None):
            return token_losses.sum() / mask.sum()
        loss = token_losses.sum() / torch.as_tensor(num_items_in_batch, device=token_losses.device)
        if self.args.average_tokens_across_devices:  # Trainer.compute_loss rescales the model's loss so
            n_gpu = self.args.n_gpu
            loss = loss * (self.accelerator.num_processes // self.get_tp_size() if n_gpu <= 1 else n_gpu)
        return loss
