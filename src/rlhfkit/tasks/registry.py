"""Name -> task registry, so command lines can say `--dataset_name positive-review`.

Each factory declares the dataset columns its reward reads (`@_reads(...)`), so listing the tasks scored from
text alone (`text_task_names`) builds none of them: a reward that needs an optional package (VADER) is only
constructed when its task is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhfkit.rewards import KeywordReward, LengthReward, SentimentJudge, exact_match_reward
from rlhfkit.tasks import addition, calculator, reviews, toy

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset


@dataclass
class Task:
    """A built-in task: where prompts come from and how completions are scored.

    `prompt_dataset(split="train"|"test", n=None, seed=0)` returns a Dataset with a "prompt" column;
    `reward(completions, **columns) -> scores` scores completions, TRL's reward-function signature (see
    `rlhfkit.rewards`). A task scored against its dataset's other columns (an exact answer) names them in
    `reward_columns`: only a trainer that passes the columns (GRPO) can train it. `sft_dataset(n, seed)`,
    when present, returns the SFT warm-start data ("text", "prompt" and "completion", or "messages" columns).
    An agent task names the `tools` its policy may call and the `chat_template` that renders them for the
    tiny tokenizer.
    """

    name: str
    description: str
    prompt_dataset: Callable[..., Dataset]
    reward: Callable[..., list[float | None]]
    sft_dataset: Callable[..., Dataset] | None = None
    reward_columns: tuple[str, ...] = ()
    tools: tuple[Callable[..., Any], ...] = ()
    chat_template: str | None = None

    def text_reward(self, argument: str, use: str) -> Callable[..., list[float | None]]:
        """`reward`, or a ValueError naming `argument` when it needs the dataset's columns, which `use` (e.g.
        "RLOO's reward") does not receive; raised before any model is loaded."""
        if self.reward_columns:
            raise ValueError(
                f"{argument} {self.name!r}: this task is scored against its dataset's "
                f"{', '.join(map(repr, self.reward_columns))} column, which {use} does not receive; "
                f"train it with `rlhfkit grpo --dataset_name {self.name}`"
            )
        return self.reward


def _reads(*columns: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Mark a task factory with the dataset columns its reward reads (its tasks' `reward_columns`)."""

    def mark(factory: Callable[..., Task]) -> Callable[..., Task]:
        factory.reward_columns = columns  # type: ignore[attr-defined]
        return factory

    return mark


@_reads()
def _positive_review() -> Task:
    return Task(
        name="positive-review",
        description="continue the opening of a movie review so that VADER judges it positive",
        prompt_dataset=reviews.review_prompt_dataset,
        reward=SentimentJudge(),
        sft_dataset=reviews.review_sft_dataset,
    )


@_reads()
def _keyword(word: str = "good", cap: int = 5, length_penalty: float = 0.0) -> Task:
    return Task(
        name="keyword",
        description=f"say {word!r} as often as possible (1 point each, at most {cap})",
        prompt_dataset=toy.toy_prompt_dataset,
        reward=KeywordReward(word, cap=cap, length_penalty=length_penalty),
    )


@_reads()
def _length(target_words: int = 2) -> Task:
    return Task(
        name="length",
        description=f"answer in exactly {target_words} words",
        prompt_dataset=toy.toy_prompt_dataset,
        reward=LengthReward(target_words),
    )


@_reads("answer")
def _addition() -> Task:
    return Task(
        name="addition",
        description="two-digit addition, `37+48=` -> `85`, scored by exact match with the 'answer' column",
        prompt_dataset=addition.addition_prompt_dataset,
        reward=exact_match_reward("answer"),
        sft_dataset=addition.addition_sft_dataset,
        reward_columns=("answer",),
    )


@_reads("answer")
def _calculator() -> Task:
    return Task(
        name="calculator",
        description="multiplication of 2-3 digit numbers with a `multiply` tool, `417*86` -> `35862`, scored "
        "by exact match of the final answer with the 'answer' column",
        prompt_dataset=calculator.calculator_prompt_dataset,
        reward=calculator.calculator_reward,
        sft_dataset=calculator.calculator_sft_dataset,
        reward_columns=("answer",),
        tools=(calculator.multiply,),
        chat_template=calculator.CHAT_TEMPLATE,
    )


def reward_columns(name: str) -> tuple[str, ...]:
    """The dataset columns the reward of task `name` reads, without building the task when its factory
    declares them (`@_reads`); an undeclared factory is built once to ask."""
    declared = getattr(TASKS[name], "reward_columns", None)
    return tuple(declared) if declared is not None else get_task(name).reward_columns


def text_task_names() -> list[str]:
    """The built-in tasks scored from completion text alone (rule judges, RLOO and PPO rewards); builds no
    reward, so listing them needs no optional package."""
    return [name for name in task_names() if not reward_columns(name)]


TASKS: dict[str, Callable[..., Task]] = {
    "addition": _addition,
    "calculator": _calculator,
    "positive-review": _positive_review,
    "keyword": _keyword,
    "length": _length,
}


def task_names() -> list[str]:
    return sorted(TASKS)


def get_task(name: str, **kwargs: Any) -> Task:
    """Build the task called `name`; keyword arguments go to its factory (e.g. `word="cat"`).

    A task whose reward needs a package that is not installed (VADER for positive-review) is a ValueError
    carrying the install hint, so a command prints it as one line.
    """
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; built-in tasks are: {', '.join(task_names())}")
    try:
        return factory(**kwargs)
    except ImportError as err:
        raise ValueError(f"task {name!r}: {err}") from err
