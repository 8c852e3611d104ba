"""Packing: many examples per row, so no compute goes to padding.

`ConstantLengthDataset` (TRL 0.x) packs raw text; `pack_examples` / `pack_dataset` (TRL 1.x's strategies, at
the end of this module) pack tokenised examples, best-fit-decreasing or wrapped.

ConstantLengthDataset:

Documents are tokenised a buffer at a time, joined with EOS, and cut into `seq_length` blocks.
Every block carries:
  * `input_ids` (seq_length,)
  * `position_ids` restarting at 0 at each document start (and at the block start), so a model
    whose attention mask is built by transformers' `create_causal_mask` (GPT-2, Llama, Qwen2, ...
    in transformers 5) sees one causal block per document when no attention_mask is passed: no
    attention across documents, on any attention backend, CPU eager included. Models that ignore
    position_ids for masking still get the labels guarantee below.
  * `labels`: the ids, except the first token of every document inside the block is -100, so the
    loss never asks the previous document's EOS to predict the next document's first token.
The remainder shorter than a block is carried into the next buffer; the final remainder is dropped.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from rlhfkit.data.preparation import example_to_text

logger = logging.getLogger(__name__)


class ConstantLengthDataset(IterableDataset):
    """Iterable of packed blocks from a text dataset (TRL 0.x's packing dataset for SFTTrainer).

    Args:
        tokenizer: turns text into ids; its eos_token_id is the default separator.
        dataset: rows with `dataset_text_field`, or rows that `formatting_func(row) -> str` formats,
            or chat rows with a `messages` column.
        infinite: restart the dataset when it runs out (then the trainer needs max_steps).
        seq_length: tokens per block.
        num_of_sequences, chars_per_token: the buffer holds about
            seq_length * chars_per_token * num_of_sequences characters before tokenising.
        eos_token_id: separator between documents (default: the tokenizer's EOS).
        shuffle: shuffle the blocks of each buffer (seeded by `seed`).
        append_concat_token: put the separator after every document.
        add_special_tokens: passed to the tokenizer (e.g. a BOS per document).
    """

    def __init__(
        self,
        tokenizer: Any,
        dataset: Any,
        dataset_text_field: str | None = None,
        formatting_func: Callable | None = None,
        infinite: bool = False,
        seq_length: int = 1024,
        num_of_sequences: int = 1024,
        chars_per_token: float = 3.6,
        eos_token_id: int | None = None,
        shuffle: bool = True,
        append_concat_token: bool = True,
        add_special_tokens: bool = True,
        seed: int = 0,
    ):
        if seq_length < 2:
            raise ValueError(f"seq_length must be >= 2, got {seq_length}")
        if (
            dataset_text_field is None
            and formatting_func is None
            and "messages" not in getattr(dataset, "column_names", [])
        ):
            raise ValueError(
                "ConstantLengthDataset needs dataset_text_field, formatting_func or a 'messages' column"
            )
        self.tokenizer = tokenizer
        self.dataset = dataset
        self.dataset_text_field = dataset_text_field
        self.formatting_func = formatting_func
        self.infinite = infinite
        self.seq_length = seq_length
        self.max_buffer_chars = int(seq_length * chars_per_token * num_of_sequences)
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if append_concat_token and self.eos_token_id is None:
            raise ValueError("append_concat_token=True needs an eos_token_id (the tokenizer has none)")
        self.shuffle = shuffle
        self.append_concat_token = append_concat_token
        self.add_special_tokens = add_special_tokens
        self.seed = seed

    def _texts(self) -> Iterator[str]:
        while True:
            empty = True
            for row in self.dataset:
                empty = False
                yield example_to_text(row, self.tokenizer, self.dataset_text_field, self.formatting_func)
            if not self.infinite or empty:
                return
            logger.info("ConstantLengthDataset: dataset exhausted, starting over (infinite=True)")

    def _blocks(self, ids: list[int], starts: list[bool]) -> tuple[list[dict], list[int], list[bool]]:
        """Cut full blocks from the token stream; return them and the leftover tail."""
        n_full = len(ids) // self.seq_length
        blocks = []
        for b in range(n_full):
            lo, hi = b * self.seq_length, (b + 1) * self.seq_length
            block_starts = list(starts[lo:hi])
            block_starts[0] = True  # the block start is a fresh context for the model
            positions, labels = [], []
            pos = 0
            for i, (token, is_start) in enumerate(zip(ids[lo:hi], block_starts)):
                pos = 0 if is_start else pos + 1
                positions.append(pos)
                labels.append(-100 if is_start and i > 0 else token)
            blocks.append(
                {
                    "input_ids": torch.tensor(ids[lo:hi], dtype=torch.long),
                    "position_ids": torch.tensor(positions, dtype=torch.long),
                    "labels": torch.tensor(labels, dtype=torch.long),
                }
            )
        cut = n_full * self.seq_length
        return blocks, ids[cut:], starts[cut:]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        rng = random.Random(self.seed)
        texts = self._texts()
        ids: list[int] = []
        starts: list[bool] = []  # True where a document begins
        exhausted = False
        while not exhausted:
            buffer, chars = [], 0
            while chars < self.max_buffer_chars:
                try:
                    text = next(texts)
                except StopIteration:
                    exhausted = True
                    break
                buffer.append(text)
                chars += len(text)
            if not buffer:
                break
            encoded = self.tokenizer(buffer, add_special_tokens=self.add_special_tokens)["input_ids"]
            for doc in encoded:
                doc = list(doc) + ([self.eos_token_id] if self.append_concat_token else [])
                if not doc:
                    continue
                ids.extend(doc)
                starts.extend([True] + [False] * (len(doc) - 1))
            blocks, ids, starts = self._blocks(ids, starts)
            if self.shuffle:
                rng.shuffle(blocks)
            yield from blocks


# --- packing tokenised examples (TRL 1.x's packing strategies) -------------------------------------------


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each summing to at most `capacity`: items longest first (ties in index order),
    each into the bin it fills most tightly (the least room that still fits; the oldest such bin), else
    into a new bin. Bins are returned in the order they were opened, items in the order they were added."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if any(n > capacity for n in lengths):
        raise ValueError(f"an item is longer than the capacity {capacity}; cut or split it first")
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (space left, bin index), sorted: bisection finds the tightest fit
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[index]
        at = bisect.bisect_left(room, (n, -1))
        if at < len(room):
            space, b = room.pop(at)
        else:
            space, b = capacity, len(bins)
            bins.append([])
        bins[b].append(index)
        if space - n > 0:
            bisect.insort(room, (space - n, b))
    return bins


def _pieces(rows: dict[str, list], seq_length: int, split: bool) -> dict[str, list]:
    """Each example cut to seq_length ('bfd'), or split into seq_length pieces ('bfd_split'); empty ones
    dropped."""
    out: dict[str, list] = {k: [] for k in rows}
    for i, ids in enumerate(rows["input_ids"]):
        starts = range(0, len(ids), seq_length) if split else range(0, min(len(ids), 1))
        for lo in starts:
            for k in rows:
                out[k].append(list(rows[k][i][lo : lo + seq_length]))
    return out


def pack_examples(rows: dict[str, list], seq_length: int, strategy: str = "bfd") -> dict[str, list]:
    """Pack a batch of tokenised examples (aligned list columns such as input_ids, completion_mask, labels).

    'bfd' / 'bfd_split': whole examples into rows of at most seq_length (`best_fit_decreasing`); each row
    also gets `seq_lengths`, the lengths of the examples in it, from which position ids restart. 'wrapped':
    the examples concatenated and cut every seq_length tokens (the last row shorter), no boundaries kept.
    """
    if strategy == "wrapped":
        flat = {k: [t for row in v for t in row] for k, v in rows.items()}
        total = len(flat["input_ids"])
        return {k: [v[lo : lo + seq_length] for lo in range(0, total, seq_length)] for k, v in flat.items()}
    if strategy not in ("bfd", "bfd_split"):
        raise ValueError(f"packing strategy must be 'bfd', 'bfd_split' or 'wrapped', got {strategy!r}")
    pieces = _pieces(rows, seq_length, split=strategy == "bfd_split")
    lengths = [len(ids) for ids in pieces["input_ids"]]
    bins = best_fit_decreasing(lengths, seq_length)
    packed = {k: [[t for i in b for t in v[i]] for b in bins] for k, v in pieces.items()}
    packed["seq_lengths"] = [[lengths[i] for i in b] for b in bins]
    return packed


def pack_dataset(dataset: Any, seq_length: int, strategy: str = "bfd", map_kwargs: dict | None = None) -> Any:
    """`pack_examples` over a `datasets.Dataset` or `IterableDataset`, a map batch (1000 rows) at a time."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    kwargs = {"seq_length": seq_length, "strategy": strategy}
    return dataset.map(pack_examples, batched=True, fn_kwargs=kwargs, **(map_kwargs or {}))
