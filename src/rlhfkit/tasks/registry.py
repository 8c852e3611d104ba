"""Name -> task registry, so command lines can say `--dataset_name positive-review`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhfkit.tasks import reviews, toy

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


@dataclass
class Task:
    """A built-in task: where prompts come from and how completions are scored.

    `prompt_dataset(split="train"|"test", n=None, seed=0)` returns a Dataset with "prompt" and
    "query" columns; `reward_fn(texts) -> scores` scores completions (one float each);
    `sft_dataset()`, when present, returns a Dataset with a "text" column.
    """

    name: str
    description: str
    prompt_dataset: Callable[..., Dataset]
    reward_fn: Callable[[list[str]], list[float]]
    sft_dataset: Callable[..., Dataset] | None = None


def _positive_review() -> Task:
    from rlhfkit.tasks.judges import SentimentJudge

    return Task(
        name="positive-review",
        description="continue the opening of a movie review so that VADER judges it positive",
        prompt_dataset=reviews.review_prompt_dataset,
        reward_fn=SentimentJudge(),
        sft_dataset=reviews.review_sft_dataset,
    )


def _keyword(word: str = "good", cap: int = 5, length_penalty: float = 0.0) -> Task:
    return Task(
        name="keyword",
        description=f"say {word!r} as often as possible (1 point each, at most {cap})",
        prompt_dataset=toy.toy_prompt_dataset,
        reward_fn=toy.KeywordReward(word, cap=cap, length_penalty=length_penalty),
    )


def _length(target_words: int = 2) -> Task:
    return Task(
        name="length",
        description=f"answer in exactly {target_words} words",
        prompt_dataset=toy.toy_prompt_dataset,
        reward_fn=toy.LengthReward(target_words),
    )


TASKS: dict[str, Callable[..., Task]] = {
    "positive-review": _positive_review,
    "keyword": _keyword,
    "length": _length,
}


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task(name: str, **kwargs: Any) -> Task:
    """Build the task called `name`; keyword arguments go to its factory (e.g. `word="cat"`)."""
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; built-in tasks are: {', '.join(task_names())}")
    return factory(**kwargs)
