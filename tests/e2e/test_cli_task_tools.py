"""`rlhfkit grpo --dataset_name calculator`: a built-in task with tools brings them and its chat template to
the command line as it brings its reward; an agent flag replaces its tools, `--chat_template_path` its
template. Whole runs sample from a script (an untrained tiny model writes no tool call) and really call the
task's `multiply`."""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
from pathlib import Path

import pytest

from rlhfkit.commands import grpo, rloo
from rlhfkit.tasks import calculator
from rlhfkit.testing import tiny_model_path

USER_MODULE = '''
import json
from pathlib import Path


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    with Path("user_calls.jsonl").open("a") as f:
        f.write(json.dumps([a, b]) + "\\n")
    return a * b


class Counter:
    def reset(self, **row):
        self.count = 0

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count


def rollout(prompts, trainer):
    raise AssertionError("not called by these tests")
'''
_ROUND = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The user's module in the working folder, named per test (sys.modules keeps what one test imported)."""
    name = f"task_tools_user_{next(_ROUND)}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def _inputs(argv: list[str]) -> dict:
    from rlhfkit.commands._args import parse_args
    from rlhfkit.trainers.grpo.config import GRPOConfig

    argv = [*argv, "--num_eval_prompts", "2", "--output_dir", "o"]
    script_args, _ = parse_args((grpo.GRPOScriptArguments, GRPOConfig), argv, "t", "")
    return grpo.inputs(script_args)[2]


def test_the_task_brings_its_tool_template_and_reward(user_module):
    extra = _inputs(["--dataset_name", "calculator"])
    assert extra["tools"] == [calculator.multiply]
    assert extra["chat_template"] == calculator.CHAT_TEMPLATE
    assert extra["reward_funcs"] == [calculator.calculator_reward]
    # a task without tools brings none (and keyword no template): the trainer is called as before
    assert set(_inputs(["--dataset_name", "keyword"])) == {"reward_funcs"}


@pytest.mark.parametrize(
    "flags, tools",
    [
        (["--tools", "{m}:add"], ["add"]),  # replaced, not added to
        (["--tools", "rlhfkit.tasks.calculator:multiply,{m}:add"], ["multiply", "add"]),  # the task's kept
        (["--environment_factory", "{m}:Counter"], None),  # the environment's methods are the tools
        (["--rollout_func", "{m}:rollout"], None),
    ],
)
def test_an_agent_flag_replaces_the_tasks_tools_and_keeps_its_template(user_module, flags, tools):
    extra = _inputs(["--dataset_name", "calculator", *[f.format(m=user_module) for f in flags]])
    assert (None if "tools" not in extra else [f.__name__ for f in extra["tools"]]) == tools
    assert extra["chat_template"] == calculator.CHAT_TEMPLATE
    assert extra["reward_funcs"] == [calculator.calculator_reward]


# ---------------------------------------------------------------- whole runs, on a scripted sampler
# Even rows call multiply on the question's operands and then repeat the tool's result; odd rows answer "0"
# at once (never a product of two 2-3 digit numbers). Each step: 2 prompts x 2 generations.
RUN_FLAGS = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "160",
             "--max_steps", "2", "--max_tool_calling_iterations", "2", "--tool_timeout", "5", "--report_to",
             "none", "--use_cpu", "--logging_steps", "1", "--save_strategy", "no", "--disable_tqdm", "true",
             "--num_eval_prompts", "2"]  # fmt: skip
QUESTION = re.compile(r"<\|user\|>\n(\d+)\*(\d+)<\|endoftext\|>")
RESULT = re.compile(r"<\|tool\|>\n(.*?)<\|endoftext\|>", re.DOTALL)


def _script(context: str, row: int) -> str:
    if "<|tool|>" in context:  # the tool has answered: repeat its result
        return RESULT.findall(context)[-1]
    if row % 2:
        return "0"
    a, b = QUESTION.search(context).groups()
    return f'<tool_call>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</tool_call>'


@pytest.fixture
def calculator_run(user_module, monkeypatch):
    """Runs on the tiny Llama, whose own chat template knows no tools; the trainer samples from `_script`
    and is kept; the task's `multiply` records its calls."""
    from rlhfkit.testing.scripted import scripted_sampler
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    calls, trained = [], []

    @functools.wraps(calculator.multiply)
    def recorded(a: int, b: int) -> int:
        calls.append((a, b))
        return a * b

    def sampler(self, *args, **kwargs):
        return scripted_sampler(self.accelerator.unwrap_model(self.model), self.processing_class, _script)

    train = GRPOTrainer.train

    def kept_train(self, *args, **kwargs):
        trained.append(self)
        return train(self, *args, **kwargs)

    monkeypatch.setattr(calculator, "multiply", recorded)
    monkeypatch.setattr(GRPOTrainer, "_sampler", sampler)
    monkeypatch.setattr(GRPOTrainer, "train", kept_train)
    base = ["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "calculator",
            "--output_dir", "run", *RUN_FLAGS]  # fmt: skip
    return base, calls, trained


def _logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_calculator_run_calls_the_tasks_multiply(calculator_run, capsys, command):
    from transformers import AutoTokenizer

    base, calls, trained = calculator_run
    code = {"grpo": grpo.main, "rloo": rloo.main}[command](base)
    assert code == 0, capsys.readouterr().err[-2000:]
    trainer = trained[0]
    # 2 steps x 2 callers, each with its own question's operands (the script copied them from the prompt
    # the task's template rendered)
    assert len(calls) == 4 and all(10 <= a <= 999 and 10 <= b <= 999 for a, b in calls)
    questions = {tuple(map(int, p[0]["content"].split("*"))) for p in trainer.train_dataset["prompt"]}
    assert set(calls) <= questions
    assert _logged(trainer, "tools/call_frequency") == [0.5, 0.5]
    assert _logged(trainer, "tools/failure_frequency") == [0.0, 0.0]
    # the task's reward: callers repeat multiply's result, the answer (1.0); the others say 0 (0.0)
    assert _logged(trainer, "reward") == [0.5, 0.5]
    assert _logged(trainer, "rewards/calculator_reward/mean") == [0.5, 0.5]
    # the task's template is saved with the model: the trained policy renders its prompts the same way
    assert AutoTokenizer.from_pretrained("run").chat_template == calculator.CHAT_TEMPLATE


def test_tools_flag_replaces_the_tasks_multiply(calculator_run, capsys, user_module):
    base, calls, trained = calculator_run
    code = grpo.main([*base, "--tools", f"{user_module}:multiply"])
    assert code == 0, capsys.readouterr().err[-2000:]
    user_calls = [json.loads(line) for line in Path("user_calls.jsonl").read_text().splitlines()]
    assert len(user_calls) == 4 and calls == []  # the user's function ran, the task's never
    assert _logged(trained[0], "reward") == [0.5, 0.5]


def test_chat_template_path_replaces_the_tasks_template(calculator_run, capsys, tmp_path):
    # a template that cannot list tools: the trainer refuses it, so it (not the task's) is the one in use
    (tmp_path / "plain.jinja").write_text(
        "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}"
    )
    base, calls, trained = calculator_run
    code = grpo.main([*base, "--chat_template_path", str(tmp_path / "plain.jinja")])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    last = err.strip().splitlines()[-1]  # the error line, after the model's loading bar
    assert last.startswith("rlhfkit grpo: error: GRPOTrainer: the chat template ignores tools"), last
    assert calls == []
