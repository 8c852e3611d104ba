"""rlhfkit at Qwen2.5-0.5B's shape, this checkout against an earlier commit, alternating: step and phases.

    python benchmarks/real_shape_ab.py --baseline 70d0e6e --rounds 3 \
        --out benchmarks/real_shape/grpo-q05-onednn-ab.json

Each round runs `real_shape.py`'s rlhfkit side (its workload, phases and memory; `--algo`, 3 steps, the
first not timed) once with the baseline's sources and once with those of this checkout's commit (both
exported with `git archive`: uncommitted changes are not measured), the order alternating between rounds;
one process at a time (~12 GiB each). Reported: every run, and per tree the median seconds and CPU seconds
per step, the median of each phase's wall seconds, the range of the step times (how noisy the machine was)
and the largest peak RSS.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = "REAL_SHAPE "  # real_shape.py


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()


def _export_sources(commit: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=HERE.parent, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _run(src: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, str(HERE / "real_shape.py"), "--child", "rlhfkit", "--algo", args.algo,
               "--work-dir", str(args.work_dir), "--steps", str(args.steps), "--threads", "2"]  # fmt: skip
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{src} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def _summary(runs: list[dict]) -> dict:
    steps = [r["seconds_per_step"] for r in runs]
    phases = {name for r in runs for name in r["phases_per_step"]}
    return {
        "median_seconds_per_step": statistics.median(steps),
        "seconds_per_step_range": [min(steps), max(steps)],
        "median_cpu_seconds_per_step": statistics.median(r["cpu_seconds_per_step"] for r in runs),
        "median_phase_wall_s": {
            name: statistics.median(r["phases_per_step"].get(name, {"wall_s": 0.0})["wall_s"] for r in runs)
            for name in sorted(phases)
        },
        "max_peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "median_peak_over_floor": statistics.median(r["peak_over_floor"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the commit to compare with")
    parser.add_argument("--algo", default="grpo", help="a workload of real_shape.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=HERE / ".work")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    head, baseline = _git("rev-parse", "--short", "HEAD"), _git("rev-parse", "--short", args.baseline)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = {tree: _export_sources(tree, Path(tmp) / tree) for tree in (baseline, head)}
        for round_ in range(1, args.rounds + 1):
            for tree in [baseline, head] if round_ % 2 else [head, baseline]:
                result = _run(sources[tree], args)
                runs.append({"tree": tree, "round": round_, "load_average": os.getloadavg(), **result})
                print(json.dumps({k: runs[-1][k] for k in ("tree", "round", "seconds_per_step",
                                  "cpu_seconds_per_step", "peak_rss_mib")}), flush=True)  # fmt: skip
    summary = {tree: _summary([r for r in runs if r["tree"] == tree]) for tree in (baseline, head)}
    summary["speedup_of_medians"] = (
        summary[baseline]["median_seconds_per_step"] / summary[head]["median_seconds_per_step"]
    )
    print(json.dumps(summary, indent=1))
    if args.out:
        command = f"python benchmarks/real_shape_ab.py --baseline {args.baseline} --algo {args.algo} "
        command += f"--rounds {args.rounds} --steps {args.steps} --out {args.out}"
        report = dict(commit=head, baseline_commit=baseline, command=command, summary=summary, runs=runs)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
