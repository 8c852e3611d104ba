"""Built-in toy tasks and data for the demo, examples and tests (no download).

- `reviews`: a synthetic movie-review corpus and its prompts ("positive-review" task)
- `judges`: the VADER sentiment judge and preference-pair labelling
- `polarity`: a learned second review judge trained on the generator's own labels (imports torch:
  `from rlhfkit.tasks.polarity import PolarityClassifier`)
- `toy`: tiny learnable rewards (keyword, length, token count) for RL learning tests
- `registry`: `get_task(name)` for command lines
- `sampling`: the seeded draw of `n` prompts from a split, shared by the tasks

Only the standard library is imported here; datasets, torch and vaderSentiment load on use.
"""

from rlhfkit.tasks.judges import SentimentJudge, label_preference_pairs
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
from rlhfkit.tasks.toy import KeywordReward, LengthReward, token_count_reward, toy_prompt_dataset, toy_prompts

__all__ = [
    "TASKS",
    "KeywordReward",
    "LengthReward",
    "SentimentJudge",
    "Task",
    "get_task",
    "label_preference_pairs",
    "prompt_split",
    "review_corpus",
    "review_prompt_dataset",
    "review_prompts",
    "review_records",
    "review_references",
    "review_sft_dataset",
    "task_names",
    "text_task_names",
    "token_count_reward",
    "toy_prompt_dataset",
    "toy_prompts",
]
