"""Python objects named on the command line: `--reward_funcs`, `--tools`, `--environment_factory`,
`--rollout_func`.

A name is `package.module:attribute` or the dotted `package.module.attribute` (TRL's `--reward_funcs`
form). The working folder comes first on sys.path, as it does for `python my_script.py`, so a user's
`my_tools.py` beside them imports. Every error names the flag and what it expected, and becomes one line
on stderr (exit code 2) through `run_main`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any


def _split(path: str, flag: str) -> tuple[str, list[str]]:
    """(module, attribute chain) of 'module:attr.sub' or 'module.attr'."""
    module, colon, attribute = path.partition(":")
    if not colon:
        module, _, attribute = path.rpartition(".")
    if not module or not attribute or any(not part for part in attribute.split(".")):
        raise ValueError(
            f"{flag} {path!r} must be an import path such as 'my_module:name' "
            "(or the dotted 'my_module.name')"
        )
    return module, attribute.split(".")


def _import_module(module: str, path: str, flag: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(
                f"{flag} {path!r}: no module named {err.name!r} (neither in the current folder "
                f"{os.getcwd()} nor installed)"
            ) from err
        raise ValueError(f"{flag} {path!r}: importing {module!r} failed: {err}") from err
    except (ImportError, SyntaxError) as err:
        raise ValueError(f"{flag} {path!r}: importing {module!r} failed: {err}") from err


def import_object(path: str, flag: str) -> Any:
    """The object `path` names ('module:attr', 'module:Class.attr' or 'module.attr')."""
    module_name, chain = _split(path, flag)
    value = _import_module(module_name, path, flag)
    for depth, name in enumerate(chain):
        if not hasattr(value, name):
            owner = ".".join([module_name, *chain[:depth]])
            raise ValueError(f"{flag} {path!r}: {owner!r} has no attribute {name!r}")
        value = getattr(value, name)
    return value


def _kind(value: Any) -> str:
    return f"a {type(value).__name__} ({value!r:.60})"


def import_callable(path: str, flag: str) -> Callable:
    """A function (or class) named by `path`; anything else is an error naming the flag."""
    value = import_object(path, flag)
    if not callable(value):
        raise ValueError(f"{flag} {path!r} is {_kind(value)}, expected a function")
    return value


def import_callables(paths: Iterable[str] | None, flag: str) -> list[Callable]:
    """The functions several paths name, in order. Each entry may hold several comma-separated paths, and
    a path may name a list or tuple of functions (a module's `TOOLS = [add, multiply]`)."""
    found: list[Callable] = []
    for entry in paths or []:
        for path in (part.strip() for part in entry.split(",")):
            if not path:
                raise ValueError(f"{flag} {entry!r}: an empty name between commas")
            value = import_object(path, flag)
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            for item in values:
                if not callable(item):
                    raise ValueError(f"{flag} {path!r} holds {_kind(item)}, expected functions")
            found.extend(values)
    return found


def import_environment_factory(path: str, flag: str) -> Callable | dict[str, Callable]:
    """An environment class or factory, or a dict of them keyed by the name a dataset's `environment`
    column selects."""
    value = import_object(path, flag)
    if isinstance(value, dict):
        if not value:
            raise ValueError(f"{flag} {path!r} is an empty dict, expected name -> environment class")
        for name, factory in value.items():
            if not isinstance(name, str) or not callable(factory):
                raise ValueError(
                    f"{flag} {path!r}: entry {name!r} maps to {_kind(factory)}, expected a str name -> "
                    "environment class or factory"
                )
        return dict(value)
    if not callable(value):
        raise ValueError(
            f"{flag} {path!r} is {_kind(value)}, expected an environment class, a factory function or a dict "
            "of them"
        )
    return value
