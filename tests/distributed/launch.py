"""Run a worker script in several CPU processes (torchrun, gloo) and collect one JSON result per rank.

Workers call `save_result(obj)`; the test gets back `[rank0_obj, rank1_obj, ...]`. Everything is CPU:
`ACCELERATE_USE_CPU=true` makes accelerate pick gloo, and each worker uses one thread so two workers
share the two cores of a small CI machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).parent / "workers"
_OUT_ENV = "RLHFKIT_DIST_OUT"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ACCELERATE_USE_CPU": "true",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")]),
        }
    )
    env.update(extra or {})
    return env


def launch(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Start `nproc` copies of `script` (a file in tests/distributed/workers or a path) and return
    their results."""
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    with tempfile.TemporaryDirectory(prefix="rlhfkit-dist-") as out:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}",
            str(script), *args,
        ]  # fmt: skip
        proc = subprocess.run(
            cmd,
            env=worker_env({_OUT_ENV: out, **(env or {})}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"distributed run failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
            )
        results = []
        for rank in range(nproc):
            path = Path(out) / f"rank{rank}.json"
            if not path.exists():
                raise AssertionError(f"rank {rank} wrote no result\n{proc.stderr[-8000:]}")
            results.append(json.loads(path.read_text()))
        return results


def save_result(obj: Any) -> None:
    """A worker's last call: store this rank's result where `launch` will look for it, then exit the process.

    Every rank waits for the others and destroys the process group before exiting: a rank that exits
    while another still works leaves gloo threads behind, and the C++ runtime may abort it (SIGABRT,
    "terminate called without an active exception"), failing an otherwise good run at random.
    """
    rank = int(os.environ.get("RANK", "0"))
    out = Path(os.environ[_OUT_ENV])
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, out / f"rank{rank}.json")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    # Leave without interpreter finalisation: gloo's C++ threads can still abort the process while static
    # objects are destroyed ("terminate called without an active exception"), after the result is safe.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
