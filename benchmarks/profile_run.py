"""Where does a workload's time go? Run one workload script under cProfile and print the top functions.

    .venv/bin/python benchmarks/profile_run.py rlhfkit ppo --model tiny --steps 2
    benchmarks/.venvs/trl-0.11/bin/python benchmarks/profile_run.py trl ppo --model tiny
    .venv/bin/python benchmarks/profile_run.py rlhfkit ppo-lv --model v152k --length 256 --warmup 0 --steps 1

Only the timed steps matter, but cProfile sees the whole script: model loading and imports show up under
their own names (`from_pretrained`, `_find_and_load`) and are easy to skip. `--sort tottime` lists the
functions that themselves burn time (kernels, Python overhead); the default `cumulative` shows the call tree.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", choices=["rlhfkit", "trl"])
    parser.add_argument("workload")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=None, help="completion length of a *-lv workload")
    parser.add_argument("--eos", action="store_true", help="completions stop at eos")
    parser.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"])
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--filter", default="", help="only list functions whose location contains this text")
    parser.add_argument("--work-dir", default=str(HERE / ".work"))
    parser.add_argument("--out", default=None, help="also save the raw profile here")
    args = parser.parse_args()
    script = HERE / "workloads" / f"{args.library}_{args.workload.replace('-', '_')}.py"
    if not script.is_file():
        parser.error(f"no workload script {script.name}")
    sys.path.insert(0, str(script.parent))
    sys.argv = [
        str(script),
        "--work-dir",
        args.work_dir,
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
    ]
    sys.argv += (["--length", str(args.length)] if args.length else []) + (["--eos"] if args.eos else [])
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        profiler.disable()
    if args.out:
        profiler.dump_stats(args.out)
    stats = pstats.Stats(profiler)
    stats.sort_stats(args.sort).print_stats(
        args.filter or None, args.top
    ) if args.filter else stats.sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
