"""The agent examples (examples/agents/): the guessing game and the calculator tools behave as their
docstrings say, and each script trains as documented, from Python and from the command line it prints."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.agents import ToolBox

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "agents"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"agent_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_guessing_game_answers_each_guess_and_scores_the_game():
    game_module = _load("guessing_game")
    game = game_module.GuessingGame()
    assert game.reset(secret=12, prompt="ignored") == "The secret number is between 1 and 20."
    assert [game.guess(5), game.guess(15), game.guess("12")] == ["higher", "lower", "correct"]
    assert game.get_reward() == pytest.approx(0.8)  # found with the 3rd guess: 1 - 2 * 0.1
    game.reset(secret=3)  # a reset forgets the last game
    assert game.get_reward() == 0.0
    assert game.guess(3) == "correct" and game.get_reward() == 1.0
    game.reset(secret=20)
    for number in range(1, 21):
        game.guess(number)
    assert game.get_reward() == pytest.approx(0.1)  # the 20th guess: floored at 0.1
    # its one public method is the tool; a bad argument is an error the model reads, not a crash
    tools = ToolBox([game.guess])
    assert tools.names == ["guess"]
    assert tools.schemas[0]["function"]["parameters"]["properties"]["number"]["type"] == "integer"
    result = tools.call("guess", {"number": "seven"}, timeout=5)
    assert result.error and "ValueError" in result.content


def test_guessing_game_dataset_holds_the_secret_reset_receives():
    games = _load("guessing_game").games(n=6, seed=1)
    assert games.column_names == ["prompt", "secret"]
    assert all(1 <= s <= 20 for s in games["secret"]) and games[0]["prompt"][0]["role"] == "user"
    assert games["secret"] == _load("guessing_game").games(n=6, seed=1)["secret"]  # seeded


def test_calculator_tools_and_their_reward():
    calc = _load("calculator_tools")
    tools = ToolBox(calc.TOOLS)
    assert tools.names == ["multiply"]
    assert tools.call("multiply", {"a": 37, "b": "48"}, timeout=5).content == "1776"
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 37, "b": 48}}}
    conversation = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": "1776"},
        {"role": "assistant", "content": " 1776 "},
    ]
    wrong = [{"role": "assistant", "content": "1777"}]
    assert calc.exact_answer(None, [conversation, wrong, "1776"], ["1776"] * 3) == [1.0, 0.0, 1.0]
    questions = calc.questions(n=5, seed=2)
    for row in questions:
        a, b = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split(" * ")
        assert row["answer"] == str(int(a) * int(b))


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(
    "example, calls", [("guessing_game", "calls per game"), ("calculator_tools", "calls per")]
)
def test_agent_example_trains(tmp_path, example, calls):
    proc = _run([sys.executable, str(EXAMPLES / f"{example}.py"), "--max_steps", "2", "--output_dir",
                 str(tmp_path / "run")], cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert calls in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", ["guessing_game", "calculator_tools"])
def test_agent_example_command_line_runs(tmp_path, example):
    """The command line the example prints runs from the example's folder, with the inputs it wrote."""
    proc = _run([sys.executable, f"{example}.py", "--write_cli_inputs", str(tmp_path / "cli")], cwd=EXAMPLES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    command = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert command[:2] == ["rlhfkit", "grpo"]
    command = [sys.executable, "-m", "rlhfkit", *command[1:], "--max_steps", "2", "--logging_steps", "1"]
    proc = _run(command, cwd=EXAMPLES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["updates"] == 2
