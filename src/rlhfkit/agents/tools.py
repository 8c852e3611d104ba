"""`ToolBox`: the functions a model may call during a rollout, and a call that can neither crash nor hang.

A tool is any Python callable with type hints and a docstring (its JSON schema, the form chat templates list
tools in, comes from `transformers.utils.get_json_schema`). A call made by the model runs on a worker thread
(an async tool: on one shared event loop) with a time limit; whatever goes wrong (an unknown name, arguments
the function does not take, an exception, `SystemExit`, the limit) becomes a short error text the model reads
as the tool's answer, so one bad call costs the episode a turn, never the trainer its run. The arguments are
the JSON the model wrote, parsed by `json.loads`: nothing the model writes is evaluated as code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_ERROR_CHARS = 300  # an error message longer than this is cut: the model reads it, the context is short


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave back: `content` is the text the model sees; `error` marks a failed call."""

    content: str
    error: bool


def tool_name(tool: Callable) -> str:
    """The name the model calls `tool` by: its `__name__` (a bound method's too)."""
    name = getattr(tool, "__name__", None)
    if not callable(tool) or not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"tools must be functions or methods with a __name__ the model can call them by, got {tool!r}"
        )
    return name


def _describe(tool: Callable) -> str:
    owner = getattr(tool, "__self__", None)
    if owner is not None:
        return f"method {type(owner).__name__}.{tool.__name__}"
    return f"function {getattr(tool, '__module__', '?')}.{getattr(tool, '__qualname__', tool.__name__)}"


@functools.lru_cache(maxsize=512)
def _schema_of(function: Callable) -> dict:
    """The JSON schema of `function`, computed once per function (environments make a ToolBox per rollout)."""
    from transformers.utils import get_json_schema

    return get_json_schema(function)


def tool_schema(tool: Callable) -> dict:
    """`tool`'s JSON schema in chat-template form; a ValueError naming the tool when it cannot have one."""
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    function = getattr(tool, "__func__", tool)  # a bound method: its schema leaves out `self`
    try:
        schema = _schema_of(function)
    except (DocstringParsingException, TypeHintParsingException) as error:
        raise ValueError(
            f"tool {tool_name(tool)!r} cannot be offered to the model: {error}. A tool needs a type hint on "
            "every argument and a docstring with a description line and an `Args:` entry per argument"
        ) from None
    return json.loads(json.dumps(schema))  # a copy: the cached one stays as it was


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def result_text(result: Any) -> str:
    """A tool's return value as the text of a tool message: JSON for dicts and lists, str() otherwise."""
    if isinstance(result, (dict, list)):
        return json.dumps(result, default=str)
    return str(result)


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def tool_loop() -> asyncio.AbstractEventLoop:
    """The event loop async tools run on: one per process, on a daemon thread, kept across calls (an
    environment's asyncio objects stay bound to one loop, as in TRL); made again if it ever stopped."""
    global _loop
    with _loop_lock:
        if _loop is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rlhfkit-async-tools", daemon=True).start()
            while not loop.is_running():
                time.sleep(0.001)
            _loop = loop
        return _loop


async def _guarded(awaitable) -> tuple[str, Any]:
    """("value", result) or ("error", exception): SystemExit raised in a tool must not stop the loop."""
    try:
        return "value", await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # noqa: BLE001
        return "error", error


def _run_on_thread(tool: Callable, arguments: dict, outcome: dict) -> None:
    """The worker thread of a plain tool; an awaitable it returns is awaited on `tool_loop()`."""
    try:
        value = tool(**arguments)
        if inspect.isawaitable(value):
            outcome["future"] = asyncio.run_coroutine_threadsafe(_guarded(value), tool_loop())
            kind, value = outcome["future"].result()
            if kind == "error":
                raise value
        outcome["text"] = result_text(value)  # here too: a __str__ that raises is the tool's error
    except BaseException as error:  # noqa: BLE001 - SystemExit inside a tool must not stop the trainer either
        outcome["error"] = error


def _call_on_thread(name: str, tool: Callable, arguments: dict, timeout: float) -> dict:
    outcome: dict[str, Any] = {}
    worker = threading.Thread(
        target=_run_on_thread, args=(tool, arguments, outcome), name=f"rlhfkit-tool-{name}", daemon=True
    )
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # abandoned: a thread cannot be killed, but the rollout moves on
        if "future" in outcome:
            outcome["future"].cancel()
        return {"timeout": True}
    return outcome


def _call_on_loop(tool: Callable, arguments: dict, timeout: float) -> dict:
    """An async tool: its coroutine runs on `tool_loop()`, cancelled when the time is up."""
    try:
        future = asyncio.run_coroutine_threadsafe(_guarded(tool(**arguments)), tool_loop())
        kind, value = future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        return {"timeout": True}
    except Exception as error:  # noqa: BLE001 - e.g. a tool that raised before making its coroutine
        return {"error": error}
    if kind == "error":
        return {"error": value}
    try:
        return {"text": result_text(value)}
    except Exception as error:  # noqa: BLE001
        return {"error": error}


class ToolBox:
    """The tools of one rollout, by name: `names`, `schemas` (for the chat template) and `call`.

    `tools` are functions, or bound methods of an environment (one ToolBox per environment instance). Every
    schema is built here, so a tool without type hints or docstring fails when the trainer is made.
    """

    def __init__(self, tools: Sequence[Callable]):
        if callable(tools) or isinstance(tools, (str, bytes, dict)) or not hasattr(tools, "__iter__"):
            raise ValueError(f"tools must be a list of functions, got {type(tools).__name__}")
        self._tools: dict[str, Callable] = {}
        for tool in tools:
            name = tool_name(tool)
            if name in self._tools:
                raise ValueError(
                    f"two tools are named {name!r}: {_describe(self._tools[name])} and {_describe(tool)}; "
                    "the model calls tools by name, so names must be unique"
                )
            self._tools[name] = tool
        self._schemas = [tool_schema(tool) for tool in self._tools.values()]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict]:
        """One JSON schema per tool, in the form `apply_chat_template(tools=...)` takes."""
        return [json.loads(json.dumps(schema)) for schema in self._schemas]

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def call(self, name: str, arguments: dict, timeout: float) -> ToolResult:
        """Run tool `name` with keyword `arguments` for at most `timeout` seconds; failures become errors."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolResult(_short(f"error: unknown tool {name!r} (tools: {known})"), True)
        if not isinstance(arguments, dict):
            return ToolResult(f"error: tool {name!r} takes its arguments as a JSON object", True)
        problem = _argument_problem(tool, arguments)
        if problem:
            return ToolResult(_short(f"error: bad arguments for tool {name!r}: {problem}"), True)
        if inspect.iscoroutinefunction(tool):
            outcome = _call_on_loop(tool, arguments, timeout)
        else:
            outcome = _call_on_thread(name, tool, arguments, timeout)
        if "timeout" in outcome:
            return ToolResult(f"error: tool {name!r} timed out after {timeout:g}s", True)
        if "error" in outcome:
            return ToolResult(_error_text(name, outcome["error"]), True)
        return ToolResult(outcome["text"], False)


def _argument_problem(tool: Callable, arguments: dict) -> str:
    """What is wrong with calling `tool(**arguments)` ("" when nothing is), in words the model can act on."""
    try:
        signature = inspect.signature(tool)
    except (TypeError, ValueError):  # a callable Python cannot read the signature of: the call decides
        return ""
    params = signature.parameters.values()
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    unexpected = [key for key in arguments if key not in named and not takes_any]
    missing = [p.name for p in params if p.name in named and p.default is p.empty and p.name not in arguments]
    parts = [f"unexpected {', '.join(map(repr, unexpected))}"] if unexpected else []
    parts += [f"missing {', '.join(map(repr, missing))}"] if missing else []
    if not parts:
        try:
            signature.bind(**arguments)
        except TypeError as error:
            parts.append(str(error))
    return f"{'; '.join(parts)} (it takes {', '.join(named) or 'no arguments'})" if parts else ""


def _error_text(name: str, error: BaseException) -> str:
    detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return _short(f"error: tool {name!r} raised {detail}")
