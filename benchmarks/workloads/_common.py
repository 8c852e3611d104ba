"""Plumbing shared by every workload script, for the rlhfkit venv and the TRL venvs alike.

Only the standard library is imported at module level: the same file runs under transformers 4.46 and 5.x.
A workload script parses `workload_args()`, builds its trainer, calls `StepClock.tick()` after every training
step (directly, or through `step_callback()` for `transformers.Trainer` loops) and ends with `emit(...)`,
which prints one line `BENCH_RESULT {json}` that benchmarks/run.py picks up.

`--device cuda` (benchmarks/gpu/run_gpu.py) runs the same workload on a GPU: `trainer_args_common` then
leaves `use_cpu` off, `StepClock.tick` waits for queued GPU work before reading the clock, and `emit` adds
the peak GPU memory. The default, `cpu`, changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULT_PREFIX = "BENCH_RESULT "
DEVICE = "cpu"  # set by workload_args(--device); read by trainer_args_common, StepClock and emit


def sync() -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (no-op on CPU)."""
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def limit_threads(n: int) -> None:
    """Pin intra-op parallelism to `n` threads (call before the first heavy import)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Idle OpenMP workers sleep instead of spinning: on a shared machine a spinning worker that loses its
    # core makes every parallel region wait for the scheduler (measured 80x slower matmuls at load 9).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(n)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set by an earlier parallel region
            pass


def workload_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work-dir", required=True, help="benchmarks/.work (models/ and data/ inside)")
    parser.add_argument(
        "--model", default="tiny", help="model size: tiny, small or a large-vocabulary v1k ... v152k-eos"
    )
    parser.add_argument(
        "--length", type=int, default=None, help="completion length (default: the workload's)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps after warmup")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--eos", action="store_true", help="realistic setting: stop at eos instead of fixed length"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cpu (the benchmark's setting) or cuda (benchmarks/gpu/run_gpu.py)",
    )
    args = parser.parse_args()
    if not (Path(args.work_dir) / "models" / f"{args.model}-policy").is_dir():
        parser.error(
            f"--model {args.model}: no {args.model}-policy folder under {args.work_dir}/models (prepare.py)"
        )
    if args.length is not None and args.length < 1:
        parser.error(f"--length must be >= 1, got {args.length}")
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    limit_threads(args.threads)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device")
    args.work_dir = Path(args.work_dir)
    return args


def model_dir(args: argparse.Namespace, kind: str = "policy") -> str:
    """Folder of the policy ("policy") or the reward model ("reward") of the chosen size."""
    return str(args.work_dir / "models" / f"{args.model}-{kind}")


def data_dir(args: argparse.Namespace) -> Path:
    """Prompts and pairs for the model's tokenizer: data/lv for the word-level large-vocabulary models."""
    return args.work_dir / "data" / ("lv" if args.model.startswith("v") else "")


def length_summary(lengths: list[int]) -> dict:
    """min / median / max / mean of completion lengths (the spread the --eos setting reports)."""
    return {
        "min": min(lengths),
        "median": statistics.median(lengths),
        "max": max(lengths),
        "mean": sum(lengths) / len(lengths),
        "count": len(lengths),
    }


def record_lengths(obj, method: str, mask_of) -> list[list[int]]:
    """Wrap `obj.<method>` so each call appends its completions' lengths (`mask_of(result)` is the (N, R)
    completion mask); returns the list it fills, one entry per call (warm-up calls included)."""
    lengths: list[list[int]] = []
    original = getattr(obj, method)

    def recorded(*args, **kwargs):
        result = original(*args, **kwargs)
        lengths.append(mask_of(result).sum(1).tolist())
        return result

    setattr(obj, method, recorded)
    return lengths


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def meta(args: argparse.Namespace) -> dict:
    return json.loads((args.work_dir / "data" / "meta.json").read_text())


class StepClock:
    """Wall-clock time of each step: tick() once at the start and after every step."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.cpu_marks: list[float] = []

    def tick(self) -> None:
        sync()
        self.marks.append(time.perf_counter())
        # CPU time of all threads: less sensitive to a busy machine
        self.cpu_marks.append(time.process_time())

    def step_times(self, warmup: int) -> list[float]:
        gaps = [b - a for a, b in zip(self.marks, self.marks[1:])]
        return gaps[warmup:]

    def cpu_times(self, warmup: int) -> list[float]:
        gaps = [b - a for a, b in zip(self.cpu_marks, self.cpu_marks[1:])]
        return gaps[warmup:]


def step_callback(clock: StepClock):
    """A transformers TrainerCallback that ticks `clock` at train begin and at every step end."""
    from transformers import TrainerCallback

    class _Tick(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.tick()

        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    return _Tick()


def peak_rss_mb() -> float:
    """Peak resident set size of this process, from the OS (VmHWM; ru_maxrss where /proc is missing), in MiB.

    Not the max of the two: Linux carries ru_maxrss across fork and exec, so a child of a large parent (run.py
    after building the 152k-vocabulary models in-process: ~520 MiB) would report the parent's size as its own
    peak, which made every import-only baseline of such a run the same number."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def trainer_args_common(output_dir: str, max_steps: int, seed: int) -> dict:
    """TrainingArguments settings both libraries share: no logging, saving or evaluation in the loop.

    float32 without gradient checkpointing everywhere: the newest TRL defaults to bf16 autocast and
    checkpointing, which would make the two sides do different work. `use_cpu` follows --device.
    """
    return dict(
        output_dir=output_dir,
        max_steps=max_steps,
        seed=seed,
        report_to=[],
        save_strategy="no",
        logging_steps=10_000,
        disable_tqdm=True,
        use_cpu=DEVICE == "cpu",
        dataloader_num_workers=0,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
    )


def emit(
    args: argparse.Namespace,
    library: str,
    workload: str,
    step_times: list[float],
    *,
    episodes_per_step: float,
    tokens_per_step: float,
    cpu_times: list[float] | None = None,
    **extra,
) -> dict:
    """Print the result line; every rate is over the timed steps only."""
    if len(step_times) < 1:
        raise RuntimeError(f"{library}/{workload}: no timed steps were recorded (did the loop run?)")
    import torch

    total = sum(step_times)
    result = {
        "library": library,
        "workload": workload,
        "model": args.model,
        "eos": bool(args.eos),
        "steps": len(step_times),
        "seconds_per_step": total / len(step_times),
        "median_step_seconds": statistics.median(step_times),
        "episodes_per_second": episodes_per_step * len(step_times) / total,
        "tokens_per_second": tokens_per_step * len(step_times) / total,
        "episodes_per_step": episodes_per_step,
        "tokens_per_step": tokens_per_step,
        "cpu_seconds_per_step": sum(cpu_times) / len(cpu_times) if cpu_times else None,
        "peak_rss_mb": peak_rss_mb(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        **extra,
    }
    if DEVICE == "cuda":
        result.update(
            device="cuda",
            gpu=torch.cuda.get_device_name(),
            gpu_peak_allocated_mb=torch.cuda.max_memory_allocated() / 2**20,
            gpu_peak_reserved_mb=torch.cuda.max_memory_reserved() / 2**20,
        )
    print("\n" + RESULT_PREFIX + json.dumps(result), flush=True)
    return result


def git_commit(*scripts: str | Path) -> str:
    """HEAD of this checkout, with `-dirty` when the measured code differs from it: src/, the workloads and
    the `scripts` that ran (the caller's own file, say). What a result file names: result files, notes and
    docs written during a run do not count. "unknown" outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    measured = [root / "src", root / "benchmarks" / "workloads", *(Path(s).resolve() for s in scripts)]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *map(str, measured)],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")
