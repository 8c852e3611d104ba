"""Where a GRPO workload's step goes: generate, backward, optimizer and the rest, in wall and CPU seconds.

    cd benchmarks
    PYTHONPATH=../src .venvs/rlhfkit/bin/python grpo_phases.py rlhfkit grpo --work-dir .work --model small
    .venvs/trl-new/bin/python grpo_phases.py trl grpo --work-dir .work --model small

Wraps transformers' `GenerationMixin.generate` (and rlhfkit's `GenerationBackend.generate`),
`Tensor.backward`, `AdamW.step` and the library's `GRPOTrainer.train`, runs workloads/<library>_<workload>.py
with the remaining arguments, and prints one `PHASES` line: {phase: (wall s, CPU s, share of train's CPU
time)} over all steps, warm-up included.
"""

import atexit
import runpy
import sys
import time
from pathlib import Path

TOTALS: dict[str, tuple[float, float]] = {}


def timed(name, fn):
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            w, c = TOTALS.get(name, (0.0, 0.0))
            TOTALS[name] = (w + time.perf_counter() - wall, c + time.process_time() - cpu)

    return wrapper


def report(library: str, workload: str) -> None:
    total = TOTALS.get("train", (0.0, 0.0))[1] or 1.0
    print(
        "PHASES",
        library,
        workload,
        {k: (round(w, 2), round(c, 2), f"{100 * c / total:.0f}%") for k, (w, c) in TOTALS.items()},
        flush=True,
    )


if __name__ == "__main__":
    library, workload = sys.argv[1], sys.argv[2]
    script = Path(__file__).resolve().parent / "workloads" / f"{library}_{workload.replace('-', '_')}.py"
    sys.path.insert(0, str(script.parent))
    sys.argv = [str(script)] + sys.argv[3:]
    import torch
    from transformers.generation.utils import GenerationMixin

    package = __import__("rlhfkit" if library == "rlhfkit" else "trl")
    GenerationMixin.generate = timed("generate", GenerationMixin.generate)
    if library == "rlhfkit":  # its trainers sample through a backend (the decode loop), not `generate`
        from rlhfkit.rollout.generation import GenerationBackend

        GenerationBackend.generate = timed("generate", GenerationBackend.generate)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.optim.AdamW.step = timed("optimizer", torch.optim.AdamW.step)
    package.GRPOTrainer.train = timed("train", package.GRPOTrainer.train)
    atexit.register(report, library, workload)
    runpy.run_path(str(script), run_name="__main__")
