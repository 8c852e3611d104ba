"""How a `trl` name becomes an rlhfkit object, or a placeholder that fails the test that uses it.

Every `trl.<anything>.<Name>` resolves to rlhfkit's public `<Name>` (or to the module listed in
`ELSEWHERE` for names rlhfkit keeps off its top level). A name rlhfkit lacks is not an import error,
which would fail every test in the file: it is a `Missing` object that raises `RlhfkitLacks` as soon
as a test calls it or reads from it, so only the tests that need the feature fail, each saying which.
"""

from __future__ import annotations

import importlib
from typing import Any

# trl path -> rlhfkit module holding a function of the same name outside rlhfkit's top level
ELSEWHERE: dict[str, str] = {
    "trl.core.respond_to_batch": "rlhfkit.rollout.respond",
}


class RlhfkitLacks(NotImplementedError):
    """A test reached a TRL name that rlhfkit does not offer."""


class Missing:
    """Stands in for a TRL name rlhfkit lacks; any use raises `RlhfkitLacks` naming it."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def _fail(self, *args: Any, **kwargs: Any):
        raise RlhfkitLacks(f"rlhfkit has no {self._qualname}")

    __call__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()

    def __mro_entries__(self, bases):
        self._fail()

    def __repr__(self) -> str:
        return f"<missing in rlhfkit: {self._qualname}>"


def resolve(module: str, name: str) -> Any:
    """The rlhfkit object for `module.name`, or a `Missing` placeholder."""
    if name.startswith("__"):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    qualname = f"{module}.{name}"
    if qualname in ELSEWHERE:
        return getattr(importlib.import_module(ELSEWHERE[qualname]), name)
    import rlhfkit

    try:
        return getattr(rlhfkit, name)
    except AttributeError:
        return Missing(qualname)


def module_getattr(module: str):
    """A module-level `__getattr__` for the shim module `module`."""

    def __getattr__(name: str) -> Any:
        return resolve(module, name)

    return __getattr__
