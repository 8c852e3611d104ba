"""Built-in toy tasks and data for the demo, examples and tests (no download).

- `reviews`: a synthetic movie-review corpus and its prompts ("positive-review" task)
- `polarity`: a learned second review judge trained on the generator's own labels (imports torch:
  `from rlhfkit.tasks.polarity import PolarityClassifier`)
- `addition`: two-digit addition problems with exact answers ("addition" task)
- `calculator`: 2-3 digit multiplication with a `multiply` tool, for agents ("calculator" task)
- `toy`: short instruction prompts for RL learning tests
- `registry`: `get_task(name)` for command lines: a task's prompts and its reward
- `sampling`: the seeded draw of `n` prompts from a split, shared by the tasks

The rewards the tasks are scored with live in `rlhfkit.rewards`. Only the standard library is imported
here; datasets, torch and vaderSentiment load on use.
"""

from rlhfkit.tasks.registry import TASKS, Task, get_task, task_names, text_task_names
from rlhfkit.tasks.reviews import (
    prompt_split,
    review_corpus,
    review_prompt_dataset,
    review_prompts,
    review_records,
    review_references,
    review_sft_dataset,
)
from rlhfkit.tasks.toy import toy_prompt_dataset, toy_prompts

__all__ = [
    "TASKS",
    "Task",
    "get_task",
    "prompt_split",
    "review_corpus",
    "review_prompt_dataset",
    "review_prompts",
    "review_records",
    "review_references",
    "review_sft_dataset",
    "task_names",
    "text_task_names",
    "toy_prompt_dataset",
    "toy_prompts",
]
