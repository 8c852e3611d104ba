"""A real `rlhfkit vllm-serve` server for tests: started from the vLLM venv on a local model folder.

vLLM lives in its own venv (`make vllm-env`: .venv-vllm); a test module starts one server (float32, eager,
1 GiB of KV cache) and stops it with its whole process group (the engine core runs in a child).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the CPU recipe: a float32 trainer's logprobs, no torch.compile warm-up
CPU_FLAGS = ("--dtype", "float32", "--enforce_eager")


@contextlib.contextmanager
def vllm_server(
    command: Path | Sequence[str],
    model: Path,
    log: Path,
    start_timeout: float = 600,
    flags: Sequence[str] = CPU_FLAGS,
) -> Iterator[str]:
    """The base URL of `command vllm-serve --model model *flags` while the block runs; RuntimeError with the
    end of its `log` when it does not start within `start_timeout` seconds. `command` is the `rlhfkit`
    program, or an argv that runs it (`[python, "-m", "rlhfkit"]` where rlhfkit is not installed)."""
    with vllm_server_process(command, model, log, start_timeout, flags) as (url, _):
        yield url


def kill_server(server: subprocess.Popen) -> None:
    """Kill a server of `vllm_server_process` at once (SIGKILL, engine core included), as a crash would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


@contextlib.contextmanager
def vllm_server_process(
    command: Path | Sequence[str],
    model: Path,
    log: Path,
    start_timeout: float = 600,
    flags: Sequence[str] = CPU_FLAGS,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`vllm_server`, also yielding the server's process (for `kill_server`: a test of a server that dies)."""
    port = free_port()
    argv = [str(command)] if isinstance(command, (str, Path)) else [str(c) for c in command]
    argv += ["vllm-serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += [*flags, "--log_level", "warning"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(url, server, start_timeout, log)
        yield url, server
    finally:
        with contextlib.suppress(ProcessLookupError):  # a server that died may leave its engine core
            os.killpg(server.pid, signal.SIGTERM)  # the engine core and its worker run in the server's group
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        kill_server(server)


def _wait_until_healthy(url: str, server: subprocess.Popen, timeout: float, log: Path) -> None:
    """Return once `url/health/` answers; RuntimeError with the log's end if the server exits or is late."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health/", timeout=5):
                return
        except (urllib.error.URLError, OSError):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the server did not start; its log ends:\n{log.read_text()[-3000:]}"
                ) from None
            time.sleep(1)
