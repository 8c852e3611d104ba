"""`rlhfkit grpo` / `rlhfkit rloo` with `--tools`, `--environment_factory` and `--rollout_func`: the flags
reach the trainer as the objects they name, a bad name is one error line naming the flag (exit 2) before
any data or model is loaded, and whole runs call the user's tool, play the user's environment and use the
user's rollout function."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

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


# ---------------------------------------------------------------- whole runs, on a scripted sampler
# An untrained tiny model never writes a tool call, so these runs sample from `scripted_sampler`: even rows
# call the tool (or guess) and then answer, odd rows answer at once. The rest is the real command.

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
GUESS = '<tool_call>{"name": "guess", "arguments": {"number": 7}}</tool_call>'
RUN_FLAGS = ["--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "96",
             "--max_steps", "2", "--max_tool_calling_iterations", "2", "--tool_timeout", "5", "--report_to",
             "none", "--use_cpu", "--logging_steps", "1", "--save_strategy", "no", "--disable_tqdm", "true",
             "--learning_rate", "1e-3"]  # fmt: skip
AGENT_MODULE = '''
import json
from pathlib import Path

LOG = Path("calls.jsonl")


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    with LOG.open("a") as f:
        f.write(json.dumps({"a": a, "b": b}) + "\\n")
    return a * b


def says_42(prompts, completions, **columns):
    with Path("conversations.jsonl").open("a") as f:
        for c in completions:
            f.write(json.dumps(c) + "\\n")
    return [float(c[-1]["content"].strip() == "42") for c in completions]


class Game:
    def reset(self, secret, **row):
        self.secret, self.guesses = secret, []
        return " Guess it."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The guess.
        """
        self.guesses.append(number)
        return "correct" if number == self.secret else ("higher" if self.secret > number else "lower")

    def get_reward(self) -> float:
        return float(self.secret in self.guesses)


def by_source(completions, source, **columns):
    return [float(s == "scripted") for s in source]


def scripted_rollout(prompts, trainer):
    tok = trainer.processing_class
    prompt_ids = [tok.apply_chat_template(p, add_generation_prompt=True)["input_ids"] for p in prompts]
    completion_ids = [tok.encode("42", add_special_tokens=False) + [tok.eos_token_id] for _ in prompts]
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": [[-1.0] * len(c) for c in completion_ids],
        "source": ["scripted"] * len(prompts),
    }
'''


@pytest.fixture
def agent_run(tmp_path, monkeypatch):
    """The working folder with the user's module (its name per test), a dataset of chat prompts, and a
    tokenizer folder whose template renders tools; the trainer samples from the script and is kept."""
    from rlhfkit.testing.chat_templates import tool_chat_tokenizer
    from rlhfkit.testing.scripted import scripted_sampler
    from rlhfkit.trainers.grpo.trainer import GRPOTrainer

    name = f"cli_agent_{next(_ROUND)}"
    (tmp_path / f"{name}.py").write_text(AGENT_MODULE)
    tool_chat_tokenizer("gpt2").save_pretrained(str(tmp_path / "tokenizer"))
    ask = [{"role": "user", "content": "What is 6 * 7?"}]
    Dataset.from_dict({"prompt": [ask] * 8, "secret": [7, 3] * 4}).to_json(str(tmp_path / "chat.jsonl"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def script(context: str, row: int) -> str:
        if context.rstrip().endswith("<|assistant|>") and "<|tool|>" in context:
            return "42"  # the tool's answer is in: the final answer
        return (GUESS if "Guess it." in context else CALL) if row % 2 == 0 else "41"

    def sampler(self, *args, **kwargs):
        return scripted_sampler(self.accelerator.unwrap_model(self.model), self.processing_class, script)

    trained = []
    train = GRPOTrainer.train

    def kept_train(self, *args, **kwargs):
        trained.append(self)
        return train(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_sampler", sampler)
    monkeypatch.setattr(GRPOTrainer, "train", kept_train)
    base = ["--model_name_or_path", str(tiny_model_path("llama")), "--tokenizer_name_or_path", "tokenizer",
            "--dataset_name", "chat.jsonl", "--output_dir", "run", *RUN_FLAGS]  # fmt: skip
    yield name, base, trained
    sys.modules.pop(name, None)


def _logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def _lines(path: str) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_tools_flag_trains_with_the_users_tool(agent_run, capsys, command):
    name, base, trained = agent_run
    main = {"grpo": grpo.main, "rloo": rloo.main}[command]
    code = main([*base, "--tools", f"{name}:multiply", "--reward_funcs", f"{name}:says_42"])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["updates"] == 2
    assert type(trained[0]).__name__ == {"grpo": "GRPOTrainer", "rloo": "GroupRLOOTrainer"}[command]
    # 2 updates x 4 rollouts, half of them callers: the user's function ran 4 times, with the model's
    # arguments
    assert _lines("calls.jsonl") == [{"a": 6, "b": 7}] * 4
    conversations = _lines("conversations.jsonl")
    assert len(conversations) == 8
    called = [c for c in conversations if len(c) == 3]
    assert len(called) == 4 and all(
        c[1] == {"role": "tool", "name": "multiply", "content": "42"} for c in called
    )
    assert _logged(trained[0], "tools/call_frequency") == [0.5, 0.5]
    assert _logged(trained[0], "reward") == [0.5, 0.5]  # the callers answer 42, the others 41


def test_environment_factory_flag_plays_one_game_per_rollout(agent_run, capsys):
    name, base, trained = agent_run
    code = grpo.main([*base, "--environment_factory", f"{name}:Game"])  # get_reward is the only reward
    assert code == 0, capsys.readouterr().err[-2000:]
    trainer = trained[0]
    # reset's " Guess it." reached every prompt (the script guesses only then), and guess is the one tool
    # offered: no call failed
    assert _logged(trainer, "tools/call_frequency") == [0.5, 0.5]
    assert _logged(trainer, "tools/failure_frequency") == [0.0, 0.0]
    games = trainer.agents.pool.instances[None]  # one per rollout, reused across steps
    assert len(games) == 4 and all(type(g).__name__ == "Game" for g in games)
    assert sorted(len(g.guesses) for g in games) == [0, 0, 1, 1]  # the last step: two guessed 7 once
    assert all(g.guesses in ([], [7]) and g.secret in (3, 7) for g in games)
    # the logged reward of the last step is get_reward of those games
    last = sum(float(g.secret in g.guesses) for g in games) / len(games)
    assert _logged(trainer, "rewards/Game/mean")[-1] == pytest.approx(last)


@pytest.mark.filterwarnings("ignore::rlhfkit.trainers.common.health.HealthWarning")  # made-up logprobs
def test_rollout_func_flag_replaces_generation(agent_run, capsys):
    name, base, trained = agent_run
    code = grpo.main(
        [*base, "--rollout_func", f"{name}:scripted_rollout", "--reward_funcs", f"{name}:by_source"]
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    assert _logged(trained[0], "reward") == [1.0, 1.0]  # the function's own column reached the reward
    assert trained[0].agents.rollout_func.__name__ == "scripted_rollout"


@pytest.mark.parametrize("command", ["grpo", "rloo"])
def test_help_lists_the_agent_flags(command, capsys):
    main = {"grpo": grpo.main, "rloo": rloo.main}[command]
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--tools", "--environment_factory", "--rollout_func", "--max_tool_calling_iterations",
                 "--tool_timeout", "--chat_template_path"):  # fmt: skip
        assert flag in text, flag
