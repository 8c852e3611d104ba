"""`rlhfkit grpo` / `rlhfkit rloo` with `--tools`, `--environment_factory` and `--rollout_func`: the flags
reach the trainer as the objects they name, and a bad name is one error line naming the flag (exit 2),
before any model is loaded."""

from __future__ import annotations

import itertools
import sys

import pytest
from datasets import Dataset

from rlhfkit.commands import grpo, rloo
from rlhfkit.testing import tiny_model_path

USER_FILES = {
    "cli_tools": '''
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
    return a * b


TOOLS = [add, multiply]
LIMIT = 3
''',
    "cli_envs": '''
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

    def get_reward(self) -> float:
        return float(self.count)


ENVIRONMENTS = {"counter": Counter}
NOT_FACTORIES = {"counter": "Counter"}
''',
    "cli_rollouts": """
def scripted(prompts, trainer):
    raise AssertionError("not called by these tests")
""",
}
_ROUND = itertools.count()


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """The user's modules in the working folder, renamed per test (sys.modules keeps what one test
    imported); returns old name -> this test's name."""
    names = {}
    for name, text in USER_FILES.items():
        names[name] = f"{name}_{next(_ROUND)}"
        (tmp_path / f"{names[name]}.py").write_text(text)
    Dataset.from_dict({"prompt": ["a b"] * 8}).to_json(str(tmp_path / "data.jsonl"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield names
    for name in names.values():
        sys.modules.pop(name, None)


def _script_args(argv: list[str]):
    from rlhfkit.commands._args import parse_args
    from rlhfkit.trainers.grpo.config import GRPOConfig

    script_args, _ = parse_args(
        (grpo.GRPOScriptArguments, GRPOConfig), [*argv, "--output_dir", "out"], "t", ""
    )
    return script_args


def test_each_flag_reaches_the_trainer_as_the_object_it_names(user_files):
    tools, envs, rollouts = user_files["cli_tools"], user_files["cli_envs"], user_files["cli_rollouts"]
    args = _script_args([
        "--dataset_name", "data.jsonl", "--reward_funcs", f"{tools}:add",
        "--tools", f"{tools}:multiply,{tools}.add", f"{tools}:TOOLS",
        "--environment_factory", f"{envs}:ENVIRONMENTS", "--rollout_func", f"{rollouts}:scripted",
    ])  # fmt: skip
    _, _, extra = grpo.inputs(args)
    assert [f.__name__ for f in extra["tools"]] == ["multiply", "add", "add", "multiply"]
    assert extra["tools"][0](6, 7) == 42  # the user's function itself, not a copy or a wrapper
    assert list(extra["environment_factory"]) == ["counter"]
    assert extra["environment_factory"]["counter"].__name__ == "Counter"
    assert extra["rollout_func"].__name__ == "scripted"
    assert [f.__name__ for f in extra["reward_funcs"]] == ["add"]


def test_without_agent_flags_the_trainer_gets_no_agent_keywords(user_files):
    _, _, extra = grpo.inputs(_script_args(["--dataset_name", "keyword"]))
    assert set(extra) == {"reward_funcs"}  # a trainer is called exactly as before the agent flags


def test_an_environment_may_be_the_only_reward_source(user_files):
    envs = user_files["cli_envs"]
    args = _script_args(["--dataset_name", "data.jsonl", "--environment_factory", f"{envs}:Counter"])
    _, _, extra = grpo.inputs(args)
    assert extra["reward_funcs"] == [] and extra["environment_factory"].__name__ == "Counter"
    with pytest.raises(ValueError, match="give --reward_funcs or --reward_model_name_or_path"):
        grpo.inputs(
            _script_args(["--dataset_name", "data.jsonl", "--tools", f"{user_files['cli_tools']}:add"])
        )


HOSTILE = [
    (["--tools", "no_such_tools_module:add"], "--tools 'no_such_tools_module:add': no module named"),
    (["--tools", "{cli_tools}:subtract"], "has no attribute 'subtract'"),
    (["--tools", "{cli_tools}:LIMIT"], "holds a int (3), expected functions"),
    (["--tools", "{cli_tools}:add,"], "an empty name between commas"),
    (["--tools", "add"], "--tools 'add' must be an import path such as 'my_module:name'"),
    (["--environment_factory", "no_such_env_module:Game"], "--environment_factory 'no_such_env_module:Game'"),
    (["--environment_factory", "{cli_envs}:Missing"], "has no attribute 'Missing'"),
    (["--environment_factory", "{cli_envs}:NOT_FACTORIES"], "entry 'counter' maps to a str"),
    (["--environment_factory", "{cli_tools}:LIMIT"], "expected an environment class, a factory function"),
    (["--rollout_func", "no_such_rollout_module:f"], "--rollout_func 'no_such_rollout_module:f': no module"),
    (["--rollout_func", "{cli_tools}:LIMIT"], "--rollout_func '{cli_tools}:LIMIT' is a int (3), expected a"),
    (["--reward_funcs", "{cli_tools}:LIMIT"], "--reward_funcs '{cli_tools}:LIMIT' holds a int (3)"),
]


@pytest.mark.parametrize("command", ["grpo", "rloo"])
@pytest.mark.parametrize("flags, message", HOSTILE, ids=[" ".join(f) for f, _ in HOSTILE])
def test_hostile_names_are_one_error_line_naming_the_flag(user_files, capsys, command, flags, message):
    """rloo: an agent flag alone picks the current form (the classic form has no tools)."""
    main = {"grpo": grpo.main, "rloo": rloo.main}[command]
    flags = [flag.format(**user_files) for flag in flags]
    reward = [] if "--reward_funcs" in flags else ["--reward_funcs", f"{user_files['cli_tools']}:add"]
    code = main(["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name", "data.jsonl",
                 "--output_dir", "run", *reward, *flags, "--use_cpu", "--report_to", "none"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and f"rlhfkit {command}: error: " in err
    assert message.format(**user_files) in err
