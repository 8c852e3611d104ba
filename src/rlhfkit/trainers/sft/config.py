"""SFTConfig: TrainingArguments plus supervised fine-tuning options (TRL 0.x's SFTTrainer keywords)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.trainers.common.config import HFTrainerConfig, ModelInitKwargs, TokenizesDatasets, option


@dataclass
class SFTConfig(ModelInitKwargs, TokenizesDatasets, HFTrainerConfig):
    """Configuration for `SFTTrainer`; every `transformers.TrainingArguments` field also applies."""

    dataset_text_field: str = option(
        "text", "Column holding the training text (ignored for formatting_func/chat data)."
    )
    packing: bool = option(False, "Pack documents into fixed max_seq_length blocks (ConstantLengthDataset).")
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
    completion_only_loss: bool = option(
        False,
        "Train only on completion tokens: the 'completion' column of prompt/completion data, or the last "
        "assistant message of conversational data. Not available with packing.",
    )
    dataset_batch_size: int = option(
        1000, "Examples tokenised per batch; <= 0 tokenises the whole dataset at once."
    )

    def validate(self) -> None:
        if self.loss_type not in ("nll", "dft"):
            raise ValueError(f"loss_type must be 'nll' or 'dft', got {self.loss_type!r}")
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
        if self.packing and self.completion_only_loss:
            raise ValueError(
                "completion_only_loss=True cannot be combined with packing=True: packed blocks mix prompts "
                "and "
                "completions of several documents. Turn one of them off."
            )
        if self.infinite and not self.packing:
            raise ValueError("infinite=True only applies with packing=True")
        if self.infinite and self.max_steps <= 0:
            raise ValueError("infinite=True makes the dataset endless: set max_steps > 0 to say when to stop")
