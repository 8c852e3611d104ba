"""The demo's optional dependencies (the `demo` extra), checked before the first stage.

Without this check a demo installed without the extra trains for minutes and then fails in the first
stage that imports one of them (VADER labels the preference pairs, matplotlib draws the report's plots).
Standard library only, so the check costs nothing.
"""

from __future__ import annotations

import importlib.util

INSTALL_COMMAND = "pip install 'rlhfkit[demo]'"


class MissingDemoDependencies(ModuleNotFoundError, ValueError):
    """Modules of the `demo` extra are not installed.

    A ValueError too: `rlhfkit` commands print it in one line."""


def required_modules(task: str) -> tuple[str, ...]:
    """Import names the demo of `task` needs beyond the core install: the sentiment task's gold judge
    is VADER, every task's report draws its plots with matplotlib."""
    return ("vaderSentiment", "matplotlib") if task == "sentiment" else ("matplotlib",)


def missing_modules(task: str) -> list[str]:
    """The required modules of `task` that cannot be imported (not installed, or blocked in sys.modules)."""
    return [name for name in required_modules(task) if importlib.util.find_spec(name) is None]


def check_demo_dependencies(task: str) -> None:
    """Raise `MissingDemoDependencies`, naming the modules and the install command, when any is missing."""
    missing = missing_modules(task)
    if missing:
        raise MissingDemoDependencies(
            f"the demo needs {', '.join(missing)}, from the optional `demo` extra; "
            f"install it with `{INSTALL_COMMAND}`"
        )
