"""SFTTrainer: supervised fine-tuning (next-token cross-entropy) of a causal language model.

Text comes from a column, a formatting function, prompt/completion columns or a chat column
rendered with the tokenizer's chat template. Examples are either padded one per row, or packed
into fixed-length blocks (`ConstantLengthDataset`) whose position ids restart at every document
so that supporting models never attend across documents. With `completion_only_loss` only the
completion tokens are trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterableDataset
from transformers import AutoModelForCausalLM

from rlhfkit.data.collators import SFTDataCollator
from rlhfkit.data.packing import ConstantLengthDataset
from rlhfkit.data.preparation import check_not_empty, prepare_sft_dataset
from rlhfkit.rollout.lm_head import chunked_label_logprobs
from rlhfkit.rollout.scoring import prefers_chunked_head
from rlhfkit.trainers.common.trainer_setup import OfflineTrainer, apply_overrides, load_policy
from rlhfkit.trainers.sft.config import SFTConfig

logger = logging.getLogger(__name__)


def packed_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    """Stack packed blocks. No attention_mask on purpose: restarting position_ids define the documents."""
    keys = ("input_ids", "position_ids", "labels")
    return {k: torch.stack([torch.as_tensor(f[k], dtype=torch.long) for f in features]) for k in keys}


class SFTTrainer(OfflineTrainer):
    """`transformers.Trainer` for supervised fine-tuning; TRL 0.x's keyword arguments override `args`.

    `model` may be a local path (loaded with AutoModelForCausalLM and `args.model_init_kwargs`, float32
    unless they name a dtype); `peft_config` wraps it with LoRA; `formatting_func(example) -> str` builds
    the text of a row. TRL 0.x's `tokenizer=` is another name for `processing_class=`.
    """

    config_class = SFTConfig
    default_output_dir = "sft_model"
    override_keywords = (
        "dataset_text_field", "packing", "max_seq_length", "infinite", "num_of_sequences", "chars_per_token",
        "dataset_num_proc", "dataset_batch_size",
    )  # fmt: skip

    def __init__(self, *args: Any, formatting_func: Callable | None = None, **kwargs: Any):
        """The arguments of `OfflineTrainer`, the `override_keywords`, and `formatting_func`."""
        self.formatting_func = formatting_func
        super().__init__(*args, **kwargs)

    def _setup(self, model: Any, args: SFTConfig, processing_class: Any, peft_config: Any) -> tuple[Any, Any]:
        owner = type(self).__name__
        if processing_class is None:
            raise ValueError(f"{owner}: `processing_class` (or `tokenizer`) is required")
        for name in ("pad_token", "eos_token"):  # SFTConfig's own choice of either, checked against the vocab
            token = getattr(args, name)
            if token is not None:
                if processing_class.convert_tokens_to_ids(token) in (None, processing_class.unk_token_id):
                    raise ValueError(f"{owner}: {name}={token!r} is not in the tokenizer's vocabulary")
                setattr(processing_class, name, token)
        if processing_class.pad_token is None:
            processing_class.pad_token = processing_class.eos_token
        model = load_policy(
            model, AutoModelForCausalLM, args.from_pretrained_kwargs(), peft_config, owner, args.seed
        )
        if args.max_seq_length is None:
            default_length = min(int(getattr(processing_class, "model_max_length", 1024) or 1024), 1024)
            args = apply_overrides(args, owner, max_seq_length=default_length)
        return model, args

    def _default_collator(self, args: SFTConfig, processing_class: Any) -> Callable:
        return packed_collator if args.packing else SFTDataCollator(processing_class.pad_token_id)

    def _prepare(self, dataset: Any, tokenizer: Any, args: SFTConfig, arg: str) -> Any:
        if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "column_names"):
            return dataset  # already packed / custom torch dataset: used as given
        if (args.dataset_kwargs or {}).get("skip_prepare_dataset"):
            return dataset  # tokenised by the caller
        check_not_empty(dataset, "SFTTrainer", arg)
        if not args.packing:
            return prepare_sft_dataset(
                dataset,
                tokenizer,
                args.max_seq_length,
                args.dataset_text_field,
                self.formatting_func,
                args.completion_only_loss,
                num_proc=args.dataset_num_proc,
                batch_size=args.dataset_batch_size,
                arg=arg,
            )
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
        """transformers' causal-LM loss; without (B, T, V) logits when they would be large.

        Then the label tokens are scored in chunks from the final hidden states (`rollout.lm_head`), with the
        same reduction as transformers 5: summed and divided by `num_items_in_batch` (the label tokens of the
        whole accumulated batch) when the Trainer passes it to a model that accepts loss kwargs, else a mean
        over this batch's label tokens. Label smoothing, `compute_loss_func`, `return_outputs` (evaluation
        and predictions want the logits) and heads that are not plain linear layers keep the logits path.
        """
        # a training forward needs no KV cache (building one costs memory); for a packed block an empty
        # cache would also hide the document boundaries from the mask builder
        inputs = {**inputs, "use_cache": False}
        if self.args.loss_type == "dft" and not return_outputs:
            return self._dft_loss(model, inputs, num_items_in_batch)
        chunked = None
        if (
            not return_outputs
            and self.label_smoother is None
            and self.compute_loss_func is None
            and "labels" in inputs
            and "shift_labels" not in inputs
            and not getattr(getattr(self.accelerator, "parallelism_config", None), "sp_enabled", False)
            and prefers_chunked_head(model, inputs["labels"].numel())
        ):
            forward = {k: v for k, v in inputs.items() if k != "labels"}
            chunked = chunked_label_logprobs(model, inputs["labels"], **forward)
        if chunked is None:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        logprobs, mask, _ = chunked
        return self._token_mean(-logprobs, mask, num_items_in_batch)

    def _dft_loss(self, model, inputs, num_items_in_batch):
        """Dynamic Fine-Tuning: sum over label tokens of -p * log p, p = exp(log p) without gradient, reduced
        like the cross-entropy. Chunked from the hidden states when the model allows, else from its logits."""
        labels = inputs["labels"]
        forward = {k: v for k, v in inputs.items() if k != "labels"}
        chunked = chunked_label_logprobs(model, labels, **forward)
        if chunked is None:
            logits = model(**forward).logits[:, :-1].float()
            targets = labels[:, 1:]
            mask = targets != -100
            logprobs = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
            logprobs = logprobs * mask
        else:
            logprobs, mask, _ = chunked
        return self._token_mean(-logprobs.exp().detach() * logprobs, mask, num_items_in_batch)

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
