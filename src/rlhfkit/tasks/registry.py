"""Name -> task registry, so command lines can say `--dataset_name positive-review`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhfkit.tasks import addition, reviews, toy

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


@dataclass
class Task:
    """A built-in task: where prompts come from and how completions are scored.

    `prompt_dataset(split="train"|"test", n=None, seed=0)` returns a Dataset with a "prompt" column;
    `reward_fn(texts) -> scores` scores completions (one float each); `sft_dataset()`, when present,
    returns a Dataset with a "text" column. A task scored against its dataset's other columns (an exact
    answer) sets `column_reward`, a GRPO reward `(prompts, completions, **columns)`; its `reward_fn`,
    which sees text only, then raises a ValueError saying so.
    """

    name: str
    description: str
    prompt_dataset: Callable[..., Dataset]
    reward_fn: Callable[[list[str]], list[float]]
    sft_dataset: Callable[..., Dataset] | None = None
    column_reward: Callable[..., list[float | None]] | None = None

    def text_reward(self, argument: str, use: str) -> Callable[[list[str]], list[float]]:
        """`reward_fn`, or a ValueError naming `argument` when this task needs its dataset's columns (before any
        model is loaded); `use` says where the text-only reward was asked for (e.g. "RLOO's reward")."""
        if self.column_reward is not None:
            raise ValueError(
                f"{argument} {self.name!r}: this task is scored against its dataset's columns, which {use} does "
                f"not receive; train it with `rlhfkit grpo --dataset_name {self.name}`"
            )
        return self.reward_fn


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


def _needs_columns(name: str, columns: str) -> Callable[[list[str]], list[float]]:
    """The `reward_fn` of a task that cannot be scored from completion text alone."""

    def reward_fn(texts: list[str]) -> list[float]:
        raise ValueError(
            f"task {name!r} scores completions against its dataset's {columns} column, which a text-only "
            f"reward does not receive; train it with `rlhfkit grpo --dataset_name {name}`"
        )

    return reward_fn


def _addition() -> Task:
    from rlhfkit.rewards import exact_match_reward

    return Task(
        name="addition",
        description="two-digit addition, `37+48=` -> `85`, scored by exact match with the 'answer' column",
        prompt_dataset=addition.addition_prompt_dataset,
        reward_fn=_needs_columns("addition", "'answer'"),
        column_reward=exact_match_reward("answer"),
    )


def text_task_names() -> list[str]:
    """The built-in tasks scored from completion text alone (rule judges, RLOO and PPO rewards)."""
    return [name for name in task_names() if TASKS[name]().column_reward is None]


TASKS: dict[str, Callable[..., Task]] = {
    "addition": _addition,
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
