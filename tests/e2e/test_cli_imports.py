"""The one resolver of objects named on the command line (`--reward_funcs`, `--tools`,
`--environment_factory`, `--rollout_func`): both path forms, the working folder importable, and an error
naming the flag and what was expected for each way a name can be wrong."""

from __future__ import annotations

import itertools
import sys

import pytest

from rlhfkit.commands._imports import (
    import_callable,
    import_callables,
    import_environment_factory,
    import_object,
)

USER_MODULE = '''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first
        b: the second
    """
    return a * b


class Game:
    def reset(self, **row):
        return None

    @staticmethod
    def build():
        return Game()


TOOLS = [add, multiply]
NOT_A_FUNCTION = 42
MIXED = [add, "multiply"]
ENVIRONMENTS = {"game": Game, "other": Game.build}
BAD_ENVIRONMENTS = {"game": Game, "broken": 3}
EMPTY = {}
'''


_MODULES = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in the working folder, under a name of its own (no clash in sys.modules between tests)."""
    name = f"user_objects_{next(_MODULES)}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the resolver adds the working folder; undone after
    yield name
    sys.modules.pop(name, None)


def test_colon_and_dotted_paths_name_the_same_object(user_module):
    by_colon = import_object(f"{user_module}:add", "--tools")
    by_dots = import_object(f"{user_module}.add", "--tools")
    assert by_colon is by_dots and by_colon(2, 3) == 5
    assert import_object(f"{user_module}:Game.build", "--environment_factory")().__class__.__name__ == "Game"
    assert import_object("json:dumps", "--tools") is __import__("json").dumps  # an installed module


def test_tools_flatten_lists_and_comma_separated_names_in_order(user_module):
    tools = import_callables([f"{user_module}:multiply,{user_module}:add", f"{user_module}:TOOLS"], "--tools")
    assert [tool.__name__ for tool in tools] == ["multiply", "add", "add", "multiply"]
    assert import_callables(None, "--tools") == []


def test_environment_factory_takes_a_class_or_a_dict_of_them(user_module):
    assert import_environment_factory(f"{user_module}:Game", "--environment_factory").__name__ == "Game"
    factories = import_environment_factory(f"{user_module}:ENVIRONMENTS", "--environment_factory")
    assert sorted(factories) == ["game", "other"]
    assert type(factories["other"]()).__name__ == "Game"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: import_object("nodots", "--tools"), "--tools 'nodots' must be an import path such as"),
        (lambda m: import_object(f"{m}:", "--tools"), "must be an import path"),
        (lambda m: import_object(f"{m}:Game.", "--tools"), "must be an import path"),
        (
            lambda m: import_object("no_such_module_here:f", "--rollout_func"),
            "--rollout_func 'no_such_module_here:f': no module named 'no_such_module_here'",
        ),
        (lambda m: import_object(f"{m}:nothing", "--tools"), "has no attribute 'nothing'"),
        (lambda m: import_object(f"{m}:Game.nothing", "--tools"), ".Game' has no attribute 'nothing'"),
        (
            lambda m: import_callable(f"{m}:NOT_A_FUNCTION", "--rollout_func"),
            "is a int (42), expected a function",
        ),
        (
            lambda m: import_callables([f"{m}:MIXED"], "--tools"),
            "holds a str ('multiply'), expected functions",
        ),
        (lambda m: import_callables([f"{m}:add,,{m}:add"], "--tools"), "an empty name between commas"),
        (
            lambda m: import_environment_factory(f"{m}:BAD_ENVIRONMENTS", "--environment_factory"),
            "entry 'broken' maps to a int (3)",
        ),
        (lambda m: import_environment_factory(f"{m}:EMPTY", "--environment_factory"), "is an empty dict"),
        (
            lambda m: import_environment_factory(f"{m}:NOT_A_FUNCTION", "--environment_factory"),
            "expected an environment class, a factory function or a dict",
        ),
    ],
)
def test_hostile_names_get_an_error_naming_the_flag(user_module, call, message):
    with pytest.raises(ValueError) as err:
        call(user_module)
    assert message in str(err.value)


def test_a_module_that_fails_to_import_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "needs_missing_dep.py").write_text("import definitely_not_installed_pkg\n")
    (tmp_path / "broken_syntax_tools.py").write_text("def f(:\n")
    with pytest.raises(ValueError, match="importing 'needs_missing_dep' failed: No module named"):
        import_object("needs_missing_dep:f", "--tools")
    with pytest.raises(ValueError, match="--tools 'broken_syntax_tools:f': importing 'broken_syntax_tools'"):
        import_object("broken_syntax_tools:f", "--tools")
