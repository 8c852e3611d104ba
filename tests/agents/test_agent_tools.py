"""ToolBox: schemas from type hints and docstrings, and calls whose every failure is an error text."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlhfkit.agents.tools import ToolBox, ToolResult, result_text


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def stats(values: list[int]) -> dict:
    """Sum and count of some numbers.

    Args:
        values: The numbers.
    """
    return {"sum": sum(values), "count": len(values)}


def quit_now(code: int) -> int:
    """Exit the process.

    Args:
        code: The exit status.
    """
    raise SystemExit(code)


async def async_add(a: int, b: int) -> int:
    """Add two integers after a short wait.

    Args:
        a: The first term.
        b: The second term.
    """
    await asyncio.sleep(0.01)
    return a + b


class Counter:
    """An environment whose tool changes its state."""

    def __init__(self):
        self.total = 0

    def add(self, amount: int) -> int:
        """Add to the running total.

        Args:
            amount: How much to add.
        """
        self.total += amount
        return self.total


def test_names_and_schemas_come_from_hints_and_docstrings():
    box = ToolBox([multiply, divide])
    assert box.names == ["multiply", "divide"]
    assert box.schemas[0] == {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first factor."},
                    "b": {"type": "integer", "description": "The second factor."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "integer"},
        },
    }
    box.schemas[0]["function"]["name"] = "changed"  # callers get copies
    assert box.schemas[0]["function"]["name"] == "multiply"


def test_bound_methods_are_tools_without_self_and_keep_their_state():
    env = Counter()
    box = ToolBox([env.add])
    assert list(box.schemas[0]["function"]["parameters"]["properties"]) == ["amount"]
    assert box.call("add", {"amount": 3}, timeout=5) == ToolResult("3", False)
    assert box.call("add", {"amount": 4}, timeout=5) == ToolResult("7", False)
    assert env.total == 7


def test_a_tool_without_docstring_or_hints_is_refused_by_name():
    def no_doc(a: int) -> int:
        return a

    def no_hints(a):
        """Echo a.

        Args:
            a: The value.
        """
        return a

    with pytest.raises(ValueError, match="tool 'no_doc' cannot be offered.*docstring"):
        ToolBox([no_doc])
    with pytest.raises(ValueError, match="tool 'no_hints' cannot be offered.*type hint"):
        ToolBox([no_hints])


def test_duplicate_names_are_refused_naming_both():
    env = Counter()

    def add(amount: int) -> int:
        """Add.

        Args:
            amount: How much.
        """
        return amount

    with pytest.raises(
        ValueError, match=r"two tools are named 'add': method Counter\.add and function .*add"
    ):
        ToolBox([env.add, add])


@pytest.mark.parametrize("bad", [multiply, "multiply", {"multiply": multiply}, [42]])
def test_tools_must_be_a_list_of_named_callables(bad):
    with pytest.raises(ValueError, match="tools must be"):
        ToolBox(bad)


def test_results_are_text_and_containers_are_json():
    box = ToolBox([multiply, stats])
    assert box.call("multiply", {"a": 6, "b": 7}, timeout=5) == ToolResult("42", False)
    assert box.call("stats", {"values": [1, 2, 3]}, timeout=5) == ToolResult('{"sum": 6, "count": 3}', False)
    assert result_text([1, "a"]) == '[1, "a"]' and result_text(None) == "None"


def test_every_failure_is_an_error_the_model_reads():
    box = ToolBox([multiply, divide, quit_now])
    unknown = box.call("power", {"a": 2}, timeout=5)
    assert unknown == ToolResult("error: unknown tool 'power' (tools: multiply, divide, quit_now)", True)
    wrong = box.call("multiply", {"x": 1, "b": 2}, timeout=5)
    assert wrong == ToolResult(
        "error: bad arguments for tool 'multiply': unexpected 'x'; missing 'a' (it takes a, b)", True
    )
    raised = box.call("divide", {"a": 1, "b": 0}, timeout=5)
    assert raised == ToolResult("error: tool 'divide' raised ZeroDivisionError: division by zero", True)
    exited = box.call("quit_now", {"code": 3}, timeout=5)  # SystemExit must not end the trainer
    assert exited == ToolResult("error: tool 'quit_now' raised SystemExit: 3", True)
    not_object = box.call("multiply", [1, 2], timeout=5)
    assert not_object.error and "JSON object" in not_object.content


def test_a_hanging_tool_times_out_and_the_caller_moves_on():
    release = threading.Event()

    def wait_forever(seconds: int) -> str:
        """Block until released.

        Args:
            seconds: Ignored.
        """
        release.wait(60)
        return "late"

    box = ToolBox([wait_forever])
    start = time.monotonic()
    result = box.call("wait_forever", {"seconds": 1}, timeout=0.2)
    elapsed = time.monotonic() - start
    release.set()
    assert result == ToolResult("error: tool 'wait_forever' timed out after 0.2s", True)
    assert 0.2 <= elapsed < 2.0


def test_async_tools_run_and_time_out_like_the_others():
    async def sleepy(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "woke"

    box = ToolBox([async_add, sleepy])
    assert box.call("async_add", {"a": 2, "b": 3}, timeout=5) == ToolResult("5", False)
    start = time.monotonic()
    assert box.call("sleepy", {"seconds": 30}, timeout=0.2) == ToolResult(
        "error: tool 'sleepy' timed out after 0.2s", True
    )
    assert time.monotonic() - start < 2.0


def test_long_error_messages_are_cut_for_the_model():
    def shout(n: int) -> str:
        """Fail loudly.

        Args:
            n: Length.
        """
        raise RuntimeError("x" * n)

    result = ToolBox([shout]).call("shout", {"n": 5000}, timeout=5)
    assert result.error and len(result.content) == 300 and result.content.endswith("...")


@pytest.mark.parametrize("timeout", [0, -1, "5", True, None])
def test_timeout_must_be_positive_seconds(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        ToolBox([multiply]).call("multiply", {"a": 1, "b": 2}, timeout=timeout)


def test_a_result_that_cannot_be_written_out_is_the_tools_error():
    class Unprintable:
        def __str__(self):
            raise RuntimeError("no text")

    def odd(n: int) -> object:
        """Return an odd object.

        Args:
            n: Ignored.
        """
        return Unprintable()

    result = ToolBox([odd]).call("odd", {"n": 1}, timeout=5)
    assert result == ToolResult("error: tool 'odd' raised RuntimeError: no text", True)


class AsyncCounter:
    """An async environment: its tools must share one event loop, call after call."""

    def __init__(self):
        self.loops = []

    async def tick(self, n: int) -> int:
        """Record the running loop.

        Args:
            n: Returned as is.
        """
        self.loops.append(asyncio.get_running_loop())
        return n

    async def leave(self, code: int) -> int:
        """Exit from inside the loop.

        Args:
            code: The status.
        """
        raise SystemExit(code)


def test_async_tools_share_one_loop_that_survives_a_system_exit():
    env = AsyncCounter()
    box = ToolBox([env.tick, env.leave])
    assert box.call("tick", {"n": 1}, timeout=5) == ToolResult("1", False)
    exited = box.call("leave", {"code": 2}, timeout=5)
    assert exited == ToolResult("error: tool 'leave' raised SystemExit: 2", True)
    assert box.call("tick", {"n": 3}, timeout=5) == ToolResult("3", False)
    assert len(env.loops) == 2 and env.loops[0] is env.loops[1] and env.loops[0].is_running()


def test_a_plain_tool_that_returns_a_coroutine_is_awaited():
    def add_one(n: int):
        """Add one, asynchronously.

        Args:
            n: The number.
        """
        return async_add(n, 1)

    assert ToolBox([add_one]).call("add_one", {"n": 41}, timeout=5) == ToolResult("42", False)
