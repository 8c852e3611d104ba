"""Prompts of the group trainers, from a map-style `Dataset` (`PromptSchedule`) or a streamed
`IterableDataset` (`PromptStream`): both hand out the rows of one generation batch by its index.

A stream has no length: training needs `max_steps`, and rows are tokenised as they are drawn. Each epoch of
the stream is read in order (shuffled through a buffer with `shuffle_dataset`, as `datasets` does), its last
partial batch dropped as with a map-style dataset. A resumed run replays the stream up to where it stopped.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.trainers.common.prompts import PromptSchedule, check_prompts, prompt_ids

SHUFFLE_BUFFER = 1000  # rows `IterableDataset.shuffle` draws from (its own default)


def is_stream(dataset: Any) -> bool:
    """True for a `datasets.IterableDataset` (any iterable without a length)."""
    return dataset is not None and not hasattr(dataset, "__len__") and hasattr(dataset, "__iter__")


class PromptStream:
    """The prompts of generation batch `n` (`rows(n)`), drawn in order from an `IterableDataset`."""

    def __init__(self, dataset: Any, prompts_per_process: int, num_processes: int, process_index: int,
                 seed: int, shuffle: bool, prepare: Any) -> None:  # fmt: skip
        self.dataset = dataset.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER) if shuffle else dataset
        self.per_process, self.global_batch = prompts_per_process, prompts_per_process * num_processes
        self.rank, self.prepare = process_index, prepare
        self._epoch, self._drawn, self._iterator = 0, 0, None

    def rows(self, batch: int) -> dict[str, list]:
        """This process's rows of generation batch `batch`, as columns (like `Dataset.__getitem__(list)`)."""
        if batch < self._drawn or self._iterator is None:  # a resumed run (or the first call): replay
            self._epoch, self._drawn, self._iterator = 0, 0, self._new_epoch(0)
        while True:
            taken = self._take()
            if self._drawn == batch:
                self._drawn += 1
                mine = taken[self.rank * self.per_process : (self.rank + 1) * self.per_process]
                return self.prepare({key: [row[key] for row in mine] for key in mine[0]})
            self._drawn += 1

    def _take(self) -> list[dict]:
        """The next `global_batch` rows, starting a new epoch when this one has too few left."""
        rows: list[dict] = []
        for _ in range(2):  # at most one restart: a fresh epoch that is still too short never will be
            rows = [row for _, row in zip(range(self.global_batch), self._iterator)]
            if len(rows) == self.global_batch:
                return rows
            self._epoch += 1
            self._iterator = self._new_epoch(self._epoch)
        raise ValueError(
            f"train_dataset (an IterableDataset) yields {len(rows)} prompts in a whole pass, but one "
            f"generation batch needs {self.global_batch} (generation_batch_size / num_generations)"
        )

    def _new_epoch(self, epoch: int) -> Any:
        if hasattr(self.dataset, "set_epoch"):  # a new shuffle order per epoch
            self.dataset.set_epoch(epoch)
        return iter(self.dataset)


def prompt_source(dataset: Any, args: Any, processes: int, rank: int, prepare: Any) -> Any:
    """A `PromptStream` for an `IterableDataset`, else a `PromptSchedule` over the rows of `dataset`: both
    answer `rows(n)`, the prompts of generation batch n."""
    per_process = args.local_prompts_per_generation
    if is_stream(dataset):
        return PromptStream(dataset, per_process, processes, rank, args.seed, args.shuffle_dataset, prepare)
    if len(dataset) < per_process * processes:
        raise ValueError(
            f"train_dataset has {len(dataset)} prompts but one generation batch needs "
            f"{per_process * processes} (generation_batch_size / num_generations)"
        )
    return IndexedPrompts(
        dataset, PromptSchedule(len(dataset), per_process, processes, rank, args.seed, args.shuffle_dataset)
    )


class IndexedPrompts:
    """The rows of a map-style dataset that `schedule` picks for each generation batch."""

    def __init__(self, dataset: Any, schedule: PromptSchedule) -> None:
        self.dataset, self.schedule = dataset, schedule

    def rows(self, batch: int) -> dict[str, list]:
        return self.dataset[self.schedule.indices(batch)]


def stream_preparer(tokenizer: Any, args: Any, models: dict[str, Any]) -> Any:
    """rows -> rows with an `input_ids` column (tokenised as `tokenize_prompts` does, cut to
    `max_prompt_length`), checked against the models' context like a map-style dataset's prompts."""

    def prepare(rows: dict[str, list]) -> dict[str, list]:
        if "input_ids" not in rows:
            if "prompt" not in rows:
                raise ValueError(
                    "train_dataset needs a 'prompt' column (text or chat messages) or a tokenised "
                    f"'input_ids' column; found columns {list(rows)}"
                )
            rows["input_ids"] = [prompt_ids(p, tokenizer, args.chat_template_kwargs) for p in rows["prompt"]]
        if args.max_prompt_length:
            rows["input_ids"] = [list(ids)[-args.max_prompt_length :] for ids in rows["input_ids"]]
        check_prompts(rows, "train_dataset", args.max_completion_length, models)
        return rows

    return prepare
