"""Multi-turn GRPO with an environment: a number-guessing game that answers each guess.

    python examples/agents/guessing_game.py                  # about a minute on a laptop CPU
    python examples/agents/guessing_game.py --max_steps 20   # any GRPOConfig / TrainingArguments flag

Every rollout gets its own `GuessingGame`; `reset(**row)` starts it from the dataset row (its `secret`
column), the public method `guess` is the tool the model calls, and `get_reward` scores the finished game
(a reward source named `GuessingGame`, weight 1, so no reward function is needed). The same run from the
command line, from this folder (so that `guessing_game` imports):

    python guessing_game.py --write_cli_inputs cli   # writes cli/games.jsonl, cli/tokenizer; prints:
    rlhfkit grpo --model_name_or_path <tiny llama> --tokenizer_name_or_path cli/tokenizer \
        --dataset_name cli/games.jsonl --environment_factory guessing_game:GuessingGame \
        --max_tool_calling_iterations 4 --output_dir cli/run ...

The tiny model is untrained: it seldom writes a well-formed call, so its reward stays near 0 and this
example shows the wiring (the `tools/*` metrics count its attempts). `rlhfkit demo --task calculator`
starts from a warm-started model and learns.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

LOW, HIGH = 1, 20


class GuessingGame:
    """One game: find the secret number; each guess is answered "higher", "lower" or "correct"."""

    def reset(self, secret: int, **row) -> str:
        self._secret = int(secret)
        self._guesses: list[int] = []
        return f"The secret number is between {LOW} and {HIGH}."  # appended to the user's message

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The number you think it is.

        Returns:
            "higher" when the secret number is higher, "lower" when it is lower, "correct" when found.
        """
        number = int(number)  # a JSON "7" is fine; "seven" is an error the model sees as the tool's answer
        self._guesses.append(number)
        if number == self._secret:
            return "correct"
        return "higher" if self._secret > number else "lower"

    def get_reward(self) -> float:
        """1 when found with the first guess, 0.1 less per extra guess (at least 0.1); 0 when never found."""
        if self._secret not in self._guesses:
            return 0.0
        return max(0.1, 1.0 - 0.1 * self._guesses.index(self._secret))


def games(n: int = 64, seed: int = 0):
    """A dataset of `n` games: a conversational prompt and the secret number `reset` receives."""
    from datasets import Dataset

    rng = random.Random(seed)
    ask = [{"role": "user", "content": "Find my secret number. Call the guess tool with a number."}]
    return Dataset.from_dict({"prompt": [ask] * n, "secret": [rng.randint(LOW, HIGH) for _ in range(n)]})


def write_cli_inputs(folder: Path) -> str:
    """Write what `rlhfkit grpo` needs for this example (the dataset, a tokenizer whose template renders
    tools) into `folder`; return the command line that trains on them, to run from this folder."""
    from rlhfkit.testing import tiny_model_path
    from rlhfkit.testing.chat_templates import tool_chat_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    games().to_json(str(folder / "games.jsonl"))
    tool_chat_tokenizer("gpt2").save_pretrained(str(folder / "tokenizer"))
    return (
        f"rlhfkit grpo --model_name_or_path {tiny_model_path('llama')} "
        f"--tokenizer_name_or_path {folder / 'tokenizer'} --dataset_name {folder / 'games.jsonl'} "
        "--environment_factory guessing_game:GuessingGame --max_tool_calling_iterations 4 "
        "--tool_timeout 5 --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 48 "
        f"--max_steps 6 --use_cpu --report_to none --save_strategy no --output_dir {folder / 'run'}"
    )


DEFAULTS = dict(
    output_dir="runs/guessing-game",
    report_to="none",
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=48,
    max_tool_calling_iterations=4,
    tool_timeout=5.0,
    max_steps=6,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    use_cpu=True,
)


def main(argv: list[str]) -> None:
    from transformers import HfArgumentParser

    from rlhfkit import GRPOConfig, GRPOTrainer
    from rlhfkit.testing import tiny_model
    from rlhfkit.testing.chat_templates import tool_chat_tokenizer

    if argv[:1] == ["--write_cli_inputs"]:
        print(write_cli_inputs(Path(argv[1])))
        return
    parser = HfArgumentParser(GRPOConfig)
    parser.set_defaults(**DEFAULTS)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    trainer = GRPOTrainer(
        model=tiny_model("llama"),
        reward_funcs=None,  # the environment's get_reward scores each game
        args=args,
        train_dataset=games(),
        processing_class=tool_chat_tokenizer("gpt2"),
        environment_factory=GuessingGame,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    print(f"calls per game {logs[-1]['tools/call_frequency']:.2f}, reward {logs[-1]['reward']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
