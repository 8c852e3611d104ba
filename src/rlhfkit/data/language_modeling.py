"""`DataCollatorForLanguageModeling`: tokenised examples -> a causal-LM batch (TRL 1.x's public collator).

Two layouts:
  * padded (default): rows right-padded to the longest, `attention_mask` 1 = a real token;
  * padding-free: the whole batch is one row of concatenated examples with `position_ids` that restart
    at 0 at every example (or at every document of a packed example, from its `seq_lengths`). No
    attention mask is sent: transformers builds one causal block per restart from the position ids, so
    no example attends to another, on any attention backend. The first label of each example is -100,
    so the previous example's last token never learns to predict it.
Labels are the example's `labels` when it has them, else its ids; `completion_mask` / `assistant_masks`
(1 = trained on) turn the other positions to -100.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data.collators import pad_sequences

IGNORE_INDEX = -100


def restarting_positions(lengths: list[int]) -> list[int]:
    """Position ids that count 0, 1, ... within each of consecutive segments of the given lengths."""
    return [i for n in lengths for i in range(n)]


def loss_labels(example: dict, completion_only_loss: bool) -> list[int]:
    """The example's labels: given ones, else its ids with the untrained positions (mask 0) set to -100."""
    if "labels" in example:
        return list(example["labels"])
    labels = list(example["input_ids"])
    masks = [example["assistant_masks"]] if "assistant_masks" in example else []
    if completion_only_loss and example.get("completion_mask") is not None:
        masks.append(example["completion_mask"])
    for mask in masks:
        if len(mask) != len(labels):
            raise ValueError(f"a mask of length {len(mask)} does not match input_ids of length {len(labels)}")
        labels = [t if m else IGNORE_INDEX for t, m in zip(labels, mask)]
    return labels


@dataclass
class DataCollatorForLanguageModeling:
    """Pads (or concatenates, `padding_free=True`) `input_ids` and their labels into a batch.

    Args:
        pad_token_id: fills the padding of `input_ids`.
        completion_only_loss: apply an example's `completion_mask` to its labels (`assistant_masks`
            always apply).
        padding_free: one concatenated row with restarting `position_ids` and no `attention_mask`.
        return_position_ids: in the padded layout, also return `position_ids` (restarting per packed
            document when examples carry `seq_lengths`).
        pad_to_multiple_of: round the padded length up to a multiple of this.
        return_tensors: only "pt".
    """

    pad_token_id: int
    completion_only_loss: bool = True
    padding_free: bool = False
    return_position_ids: bool = False
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt', got {self.return_tensors!r}")
        if not isinstance(self.pad_token_id, int):
            raise TypeError(f"pad_token_id must be an int token id, got {self.pad_token_id!r}")

    @staticmethod
    def get_position_ids_from_packed_seq_lengths(batch_seq_lengths: list[list[int]]) -> list[torch.Tensor]:
        """One position-id tensor per packed row, restarting at 0 at each of its documents (TRL 1.x's helper).

        batch_seq_lengths[i] lists the document lengths of row i; row i's tensor has sum(...) entries.
        """
        return [
            torch.tensor(restarting_positions(list(lengths)), dtype=torch.long)
            for lengths in batch_seq_lengths
        ]

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples or "input_ids" not in examples[0]:
            raise ValueError("DataCollatorForLanguageModeling needs examples with an 'input_ids' list")
        ids = [list(e["input_ids"]) for e in examples]
        labels = [loss_labels(e, self.completion_only_loss) for e in examples]
        lengths = [list(e["seq_lengths"]) if "seq_lengths" in e else [len(x)] for e, x in zip(examples, ids)]
        for n, x in zip(lengths, ids):
            if sum(n) != len(x):
                raise ValueError(f"seq_lengths {n} sum to {sum(n)}, but the row has {len(x)} input_ids")
        positions = [restarting_positions(n) for n in lengths]
        multiple = self.pad_to_multiple_of
        if self.padding_free:
            flat_labels = [label for row in labels for label in row]
            flat_positions = [p for row in positions for p in row]
            flat_labels = [IGNORE_INDEX if p == 0 else t for t, p in zip(flat_labels, flat_positions)]
            return {
                "input_ids": pad_sequences(
                    [[t for row in ids for t in row]], self.pad_token_id, "right", multiple
                ),
                "labels": pad_sequences([flat_labels], IGNORE_INDEX, "right", multiple),
                "position_ids": pad_sequences([flat_positions], 0, "right", multiple),
            }
        batch = {
            "input_ids": pad_sequences(ids, self.pad_token_id, "right", multiple),
            "attention_mask": pad_sequences([[1] * len(x) for x in ids], 0, "right", multiple),
            "labels": pad_sequences(labels, IGNORE_INDEX, "right", multiple),
        }
        if self.return_position_ids:
            batch["position_ids"] = pad_sequences(positions, 0, "right", multiple)
        return batch
