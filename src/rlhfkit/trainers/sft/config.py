"""SFTConfig: TrainingArguments plus supervised fine-tuning options (TRL 0.x's keywords, TRL 1.x's fields)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.trainers.common.config import (
    ChatTemplatePath,
    HFTrainerConfig,
    ModelInitKwargs,
    PadToMultipleOf,
    RouterAuxLossCoef,
    TokenizesDatasets,
    option,
)

PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped", "constant_length")


@dataclass
class SFTConfig(
    RouterAuxLossCoef, ChatTemplatePath, PadToMultipleOf, ModelInitKwargs, TokenizesDatasets, HFTrainerConfig
):
    """Configuration for `SFTTrainer`; every `transformers.TrainingArguments` field also applies."""

    dataset_text_field: str = option(
        "text", "Column holding the training text (ignored for formatting_func/chat data)."
    )
    packing: bool = option(False, "Pack several tokenised examples into each row of max_length tokens.")
    packing_strategy: str | None = option(
        None,
        "'bfd': best-fit decreasing, whole examples into bins of max_length (a longer one is cut), "
        "trained padding-free; 'bfd_split': the same, a longer example split over bins; 'wrapped': the "
        "token stream cut every max_length tokens; 'constant_length': TRL 0.x's ConstantLengthDataset. "
        "None: 'constant_length' when TRL 0.x's max_seq_length or infinite is given, else 'bfd'.",
    )
    padding_free: bool = option(
        False,
        "Concatenate a batch into one row without padding; position_ids restart at each example (implied by "
        "packing_strategy 'bfd'/'bfd_split').",
    )
    eval_packing: bool | None = option(None, "Pack the eval datasets too. None: as `packing`.")
    shuffle_dataset: bool = option(False, "Shuffle each prepared dataset (before packing too) with `seed`.")
    truncation_mode: str = option(
        "keep_start", "Where a sequence longer than max_length is cut: 'keep_start' or 'keep_end'."
    )
    max_seq_length: int | None = option(
        None, "Tokens per example (or per packed block). None: min(tokenizer.model_max_length, 1024)."
    )
    max_length: int | None = option(None, "TRL 1.x's name for max_seq_length (give one of them).")
    pad_token: str | None = option(
        None, "Padding token (in the tokenizer's vocabulary). None: its pad token, else its eos token."
    )
    eos_token: str | None = option(
        None, "Token appended at the end of each example (in the vocabulary). None: the tokenizer's eos."
    )
    loss_type: str = option(
        "nll",
        "'nll': cross-entropy. 'dft': Dynamic Fine-Tuning (Wu et al. 2025), each token's -log p weighted by "
        "its probability p (no gradient through the weight).",
    )
    dataset_kwargs: dict | None = option(
        None, "{'skip_prepare_dataset': True}: the datasets are already tokenised; use them as given."
    )
    infinite: bool = option(False, "With packing: cycle through the dataset forever (max_steps must be set).")
    num_of_sequences: int = option(1024, "With packing: documents read into the buffer before tokenising it.")
    chars_per_token: float = option(
        3.6, "With packing: estimated characters per token, sizing the text buffer."
    )
    append_concat_token: bool = option(True, "With packing: put the EOS token between packed documents.")
    completion_only_loss: bool | None = option(
        None,
        "Train only on completion tokens: the 'completion' column of prompt/completion data, or the last "
        "assistant message of conversational data. None: on for prompt/completion data, off otherwise.",
    )
    assistant_only_loss: bool = option(
        False,
        "Conversational data: train only on the assistant turns, as the chat template's generation ... "
        "endgeneration blocks mark them, or, without such blocks, as found by rendering the conversation up "
        "to each assistant message (a prefix-stable template).",
    )
    dataset_batch_size: int = option(
        1000, "Examples tokenised per batch; <= 0 tokenises the whole dataset at once."
    )

    def validate(self) -> None:
        if self.loss_type not in ("nll", "dft"):
            raise ValueError(f"loss_type must be 'nll' or 'dft', got {self.loss_type!r}")
        if self.truncation_mode not in ("keep_start", "keep_end"):
            raise ValueError(
                f"truncation_mode must be 'keep_start' or 'keep_end', got {self.truncation_mode!r}"
            )
        if self.packing_strategy not in (None, *PACKING_STRATEGIES):
            raise ValueError(
                f"packing_strategy must be one of {PACKING_STRATEGIES} or None, got {self.packing_strategy!r}"
            )
        if self.max_length is not None:  # TRL 1.x's spelling of max_seq_length
            if self.max_seq_length not in (None, self.max_length):
                raise ValueError(
                    f"max_length={self.max_length} and max_seq_length={self.max_seq_length} name one "
                    "setting; give one of them"
                )
            self.max_seq_length = self.max_length
        if self.max_seq_length is not None and self.max_seq_length < 2:
            raise ValueError(f"max_seq_length must be >= 2 or None, got {self.max_seq_length}")
        if self.num_of_sequences < 1:
            raise ValueError(f"num_of_sequences must be >= 1, got {self.num_of_sequences}")
        if self.chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be > 0, got {self.chars_per_token}")
        text_packing = self.packing and self.resolved_packing_strategy() == "constant_length"
        for name in ("completion_only_loss", "assistant_only_loss"):
            if text_packing and getattr(self, name):
                raise ValueError(
                    f"{name}=True cannot be combined with packing=True and the 'constant_length' packing "
                    "strategy, which packs raw text without masks; use packing_strategy='bfd' or turn one "
                    "of them off"
                )
        if self.infinite and not self.packing:
            raise ValueError("infinite=True only applies with packing=True")
        if self.infinite and self.max_steps <= 0:
            raise ValueError("infinite=True makes the dataset endless: set max_steps > 0 to say when to stop")

    def resolved_packing_strategy(self) -> str:
        """The packing strategy in force (packing_strategy, or its default for the way lengths were given)."""
        if self.packing_strategy is not None:
            return self.packing_strategy
        legacy = (self.max_length is None and self.max_seq_length is not None) or self.infinite
        return "constant_length" if legacy else "bfd"  # TRL 0.x's spelling keeps TRL 0.x's packing

    def uses_padding_free(self, packing: bool | None = None) -> bool:
        """Whether batches are concatenated without padding (TRL 1.x: forced by the 'bfd' strategies)."""
        packing = self.packing if packing is None else packing
        return self.padding_free or (packing and self.resolved_packing_strategy() in ("bfd", "bfd_split"))
