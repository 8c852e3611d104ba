"""The CPU benchmark's workloads on one CUDA GPU: rlhfkit against TRL 1.16, same models, same data.

    python benchmarks/gpu/run_gpu.py --work-dir /tmp/bench-work --prepare [--sizes tiny,small] [--repeats 2]

Why a separate driver: benchmarks/run.py pins everything to 2 CPU threads in per-library venvs; on the GPU
machine both libraries share one interpreter (wheels on PYTHONPATH) and TRL 0.11 cannot be installed, so
PPO runs for rlhfkit only. Each run is its own subprocess of `workloads/<library>_<workload>.py --device
cuda`, the two libraries alternate which goes first, and the table reports medians over repeats of each
run's median step time. Results are written after every run, so a run cut short still leaves a file.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
WORKLOADS = BENCH / "workloads"
RESULT_PREFIX = "BENCH_RESULT "
# (workload, libraries): TRL's classic PPO exists only in 0.11, which does not install next to transformers 5
PLAN = {
    "ppo": ("rlhfkit",),
    "rloo": ("rlhfkit", "trl"),
    "sft": ("rlhfkit", "trl"),
    "reward": ("rlhfkit", "trl"),
    "dpo": ("rlhfkit", "trl"),
}
VERSIONED = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "trl",
    "peft",
    "tokenizers",
    "huggingface_hub",
    "diffusers",
    "safetensors",
    "numpy",
)


def log(msg: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONHASHSEED": "0",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "ACCELERATE_LOG_LEVEL": "error",
            "WANDB_DISABLED": "true",
            "DISABLE_MLFLOW_INTEGRATION": "TRUE",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_one(library: str, workload: str, model: str, args: argparse.Namespace, log_dir: Path) -> dict:
    script = WORKLOADS / f"{library}_{workload}.py"
    cmd = [
        args.python,
        str(script),
        "--work-dir",
        str(args.work_dir),
        "--model",
        model,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--seed",
        "0",
        "--threads",
        str(args.threads),
        "--device",
        "cuda",
    ]
    log_path = log_dir / f"{library}-{workload}-{model}-{int(time.time() * 1000)}.log"
    start = time.perf_counter()
    with open(log_path, "w") as out:
        try:
            proc = subprocess.run(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(args.threads),
                cwd=WORKLOADS,
                timeout=args.timeout,
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    lines = [ln[ln.index(RESULT_PREFIX) :] for ln in text.splitlines() if RESULT_PREFIX in ln]
    base = {"library": library, "workload": workload, "model": model, "process_wall_seconds": wall}
    if code != 0 or not lines:
        return {**base, "error": f"exit {code}", "tail": "\n".join(text.splitlines()[-25:])}
    return {**base, **json.loads(lines[-1][len(RESULT_PREFIX) :])}


def versions() -> dict[str, str]:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def device_info() -> dict:
    import torch

    info = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
    return info


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (workload, size): medians over repeats of each side's median step time and peak memory."""
    rows = []
    for workload, libraries in PLAN.items():
        for size in sorted({r["model"] for r in runs}, key=["tiny", "small"].index):
            row = {"workload": workload, "model": size}
            for lib in libraries:
                ok = [
                    r
                    for r in runs
                    if r["workload"] == workload
                    and r["model"] == size
                    and r["library"] == lib
                    and "error" not in r
                ]
                failed = [
                    r
                    for r in runs
                    if r["workload"] == workload
                    and r["model"] == size
                    and r["library"] == lib
                    and "error" in r
                ]
                if failed and not ok:
                    row[f"{lib}_error"] = failed[0]["error"]
                if not ok:
                    continue
                step = statistics.median(r["median_step_seconds"] for r in ok)
                row[f"{lib}_step_ms"] = 1000 * step
                row[f"{lib}_eps"] = ok[0]["episodes_per_step"] / step
                row[f"{lib}_tokens_per_s"] = ok[0]["tokens_per_step"] / step
                row[f"{lib}_gpu_peak_mb"] = statistics.median(
                    r.get("gpu_peak_allocated_mb", float("nan")) for r in ok
                )
                row[f"{lib}_runs"] = len(ok)
                if "phases" in ok[0]:
                    row[f"{lib}_phases_ms"] = {
                        k: 1000 * statistics.median(r["phases"][k] for r in ok) for k in ok[0]["phases"]
                    }
            if "rlhfkit_eps" in row and "trl_eps" in row:
                row["speed_ratio"] = row["rlhfkit_eps"] / row["trl_eps"]
                row["memory_ratio"] = row["rlhfkit_gpu_peak_mb"] / row["trl_gpu_peak_mb"]
            if len(row) > 2:
                rows.append(row)
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    def num(value, fmt="{:.1f}"):
        return fmt.format(value) if isinstance(value, int | float) else "-"

    lines = [
        "| workload | model | rlhfkit ms/step | TRL 1.16 ms/step | rlhfkit episodes/s | TRL episodes/s | "
        "speed ratio (rlhfkit/TRL) | rlhfkit GPU peak MiB | TRL GPU peak MiB | memory ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        trl_ms = num(r.get("trl_step_ms")) if "trl" in PLAN[r["workload"]] else "n/a (TRL 0.11 only)"
        if "trl_error" in r:
            trl_ms = f"failed: {r['trl_error']}"
        mine = num(r.get("rlhfkit_step_ms")) if "rlhfkit_error" not in r else f"failed: {r['rlhfkit_error']}"
        lines.append(
            f"| {r['workload']} | {r['model']} | {mine} | {trl_ms} | {num(r.get('rlhfkit_eps'))} | "
            f"{num(r.get('trl_eps'))} | {num(r.get('speed_ratio'), '{:.2f}x')} | "
            f"{num(r.get('rlhfkit_gpu_peak_mb'))} | {num(r.get('trl_gpu_peak_mb'))} | "
            f"{num(r.get('memory_ratio'), '{:.2f}x')} |"
        )
    phases = [r for r in rows if "rlhfkit_phases_ms" in r]
    if phases:
        lines += ["", "rlhfkit PPO, where a step goes (median ms):", ""]
        for r in phases:
            lines.append(
                f"- {r['model']}: " + ", ".join(f"{k} {v:.0f}" for k, v in r["rlhfkit_phases_ms"].items())
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=BENCH / ".work" / "gpu")
    parser.add_argument(
        "--prepare", action="store_true", help="write models and data first (benchmarks/prepare.py)"
    )
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--workloads", default=",".join(PLAN))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--repeat-offset",
        type=int,
        default=0,
        help="number of the first repeat (a later call continues the alternation)",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (CUDA kernels, allocator)")
    parser.add_argument(
        "--threads", type=int, default=4, help="CPU threads per run (the host side of the loop)"
    )
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    parser.add_argument("--python", default=sys.executable, help="interpreter for both libraries")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or BENCH / ".work" / "gpu" / "out")
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=[],
        help="earlier results_gpu.json files whose runs are kept (with --repeats 0: only re-render)",
    )
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in PLAN]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {list(PLAN)}")
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = args.work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    if args.prepare and args.repeats > 0:
        sys.path.insert(0, str(BENCH))
        import prepare

        log(f"models and data -> {args.work_dir}")
        prepare.prepare(args.work_dir, sizes, sd=False)

    command = " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    earlier = [json.loads(path.read_text()) for path in args.merge]
    runs: list[dict] = [run for doc in earlier for run in doc.get("runs", [])]
    commands = [c for doc in earlier for c in doc.get("meta", {}).get("commands", [])] + [command]
    if args.repeats == 0:  # re-render only: the machine facts are those of the merged files
        if not earlier:
            parser.error("--repeats 0 needs --merge FILE ...")
        meta = {**earlier[0]["meta"], "commands": commands}
    else:
        meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "device": device_info(),
            "versions": versions(),
            "python": platform.python_version(),
            "commands": commands,
            "settings": {
                "steps": args.steps,
                "warmup": args.warmup,
                "threads": args.threads,
                "repeats per call": args.repeats,
                "precision": "float32 (bf16/fp16 off on both sides), no gradient checkpointing",
            },
        }
    write(args.out, meta, runs)
    for repeat in range(args.repeat_offset, args.repeat_offset + args.repeats):
        for size in sizes:
            for workload in workloads:
                libraries = PLAN[workload]
                order = libraries if repeat % 2 == 0 else tuple(reversed(libraries))
                for library in order:
                    result = run_one(library, workload, size, args, log_dir)
                    result["repeat"] = repeat
                    runs.append(result)
                    what = (
                        result.get("error")
                        or f"{1000 * result['median_step_seconds']:.1f} ms/step, "
                        f"peak {result.get('gpu_peak_allocated_mb', float('nan')):.0f} MiB"
                    )
                    log(f"repeat {repeat} {size:5s} {workload:6s} {library:7s}: {what}")
                    if "tail" in result:
                        print(result["tail"], flush=True)
                    write(args.out, meta, runs)
    print(markdown(meta, summarize(runs)), flush=True)


def write(out: Path, meta: dict, runs: list[dict]) -> None:
    rows = summarize(runs)
    (out / "results_gpu.json").write_text(
        json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=2) + "\n"
    )
    (out / "table_gpu.md").write_text(markdown(meta, rows))


if __name__ == "__main__":
    main()
