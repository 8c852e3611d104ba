"""GRPO on the small benchmark models, this checkout against an earlier commit, alternating: is anything
slower at the small shapes?

    python benchmarks/small_shapes_ab.py --baseline 204e397 --rounds 5 \
        --out benchmarks/real_shape/small-shapes-ab.json

Each round runs `workloads/rlhfkit_grpo.py` (16 completions a step, 5 timed steps after one warmup) on the
tiny and the small model, once with the baseline's sources (a git worktree) and once with this checkout's,
the order alternating between rounds. Reported: every run, and per tree and model the median seconds and CPU
seconds per step over the rounds and the largest peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workloads" / "rlhfkit_grpo.py"
RESULT_PREFIX = "BENCH_RESULT "  # workloads/_common.py


def _git(*args: str, cwd: Path = HERE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _run(src: Path, model: str, work_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "2"}
    command = [sys.executable, str(WORKLOAD), "--work-dir", str(work_dir), "--model", model, "--steps", "5",
               "--warmup", "1"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=WORKLOAD.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{model} with {src} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=HERE / ".work")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    head = _git("rev-parse", "--short", "HEAD")
    baseline = _git("rev-parse", "--short", args.baseline)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        _git("worktree", "add", "--detach", str(tree), baseline)
        try:
            sources = {baseline: tree / "src", head: HERE.parent / "src"}
            for round_ in range(1, args.rounds + 1):
                order = [baseline, head] if round_ % 2 else [head, baseline]
                for name in order:
                    for model in ("tiny", "small"):
                        result = _run(sources[name], model, args.work_dir)
                        runs.append({"tree": name, "round": round_, "model": model,
                                     "seconds_per_step": result["seconds_per_step"],
                                     "cpu_seconds_per_step": result["cpu_seconds_per_step"],
                                     "peak_rss_mb": result["peak_rss_mb"]})  # fmt: skip
                        print(json.dumps(runs[-1]), flush=True)
        finally:
            _git("worktree", "remove", "--force", str(tree))
    summary = {}
    for name in (baseline, head):
        for model in ("tiny", "small"):
            mine = [r for r in runs if r["tree"] == name and r["model"] == model]
            summary[f"{name}/{model}"] = {
                "median_seconds_per_step": statistics.median(r["seconds_per_step"] for r in mine),
                "median_cpu_seconds_per_step": statistics.median(r["cpu_seconds_per_step"] for r in mine),
                "max_peak_rss_mb": max(r["peak_rss_mb"] for r in mine),
            }
    print(json.dumps(summary, indent=1))
    if args.out:
        command = f"python benchmarks/small_shapes_ab.py --baseline {args.baseline} --rounds {args.rounds}"
        report = dict(commit=head, baseline_commit=baseline, command=command + f" --out {args.out}",
                      runs=runs, summary=summary)  # fmt: skip
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
