"""GRPO with a tool: the model may call a calculator while it answers multiplication questions.

    python examples/agents/calculator_tools.py                  # about a minute on a laptop CPU
    python examples/agents/calculator_tools.py --max_steps 20   # any GRPOConfig / TrainingArguments flag

A tool is a plain function with type hints and a docstring (its JSON schema, shown to the model by the
chat template, is read from them). `exact_answer` reads the conversation (`completions` are message
lists when prompts are) and scores the model's last message against the dataset's `answer` column. The
same run from the command line, from this folder (so that `calculator_tools` imports):

    python calculator_tools.py --write_cli_inputs cli   # writes cli/questions.jsonl, cli/tokenizer; prints:
    rlhfkit grpo --model_name_or_path <tiny llama> --tokenizer_name_or_path cli/tokenizer \
        --dataset_name cli/questions.jsonl --tools calculator_tools:TOOLS \
        --reward_funcs calculator_tools:exact_answer --max_tool_calling_iterations 2 --output_dir cli/run ...

The tiny model is untrained, so this shows the wiring rather than learning; `rlhfkit demo --task
calculator` starts from a warm-started model and learns.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        Their product.
    """
    return int(a) * int(b)


# `--tools calculator_tools:TOOLS` takes the list. One tool only: every schema is listed in the prompt, and
# the tiny model's context is 512 tokens.
TOOLS = [multiply]


def exact_answer(prompts, completions, answer, **columns) -> list[float]:
    """1 when the conversation's last message is exactly the answer, else 0."""
    return [float(_final_text(c).strip() == a) for c, a in zip(completions, answer)]


def _final_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


def questions(n: int = 64, seed: int = 0):
    """`n` products of two 2-digit numbers, too hard for a tiny model without the tool."""
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(n)]
    prompts = [[{"role": "user", "content": f"What is {a} * {b}? Use the tools."}] for a, b in pairs]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(a * b) for a, b in pairs]})


def write_cli_inputs(folder: Path) -> str:
    """Write what `rlhfkit grpo` needs for this example (the dataset, a tokenizer whose template renders
    tools) into `folder`; return the command line that trains on them, to run from this folder."""
    from rlhfkit.testing import tiny_model_path
    from rlhfkit.testing.chat_templates import tool_chat_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    questions().to_json(str(folder / "questions.jsonl"))
    tool_chat_tokenizer("gpt2").save_pretrained(str(folder / "tokenizer"))
    return (
        f"rlhfkit grpo --model_name_or_path {tiny_model_path('llama')} "
        f"--tokenizer_name_or_path {folder / 'tokenizer'} --dataset_name {folder / 'questions.jsonl'} "
        "--tools calculator_tools:TOOLS --reward_funcs calculator_tools:exact_answer "
        "--max_tool_calling_iterations 2 "
        "--tool_timeout 5 --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 48 "
        f"--max_steps 6 --use_cpu --report_to none --save_strategy no --output_dir {folder / 'run'}"
    )


DEFAULTS = dict(
    output_dir="runs/calculator",
    report_to="none",
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=48,
    max_tool_calling_iterations=2,
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
        reward_funcs=exact_answer,
        args=args,
        train_dataset=questions(),
        processing_class=tool_chat_tokenizer("gpt2"),
        tools=TOOLS,
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    print(f"calls per answer {logs[-1]['tools/call_frequency']:.2f}, reward {logs[-1]['reward']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
