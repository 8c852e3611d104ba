"""Run `rlhfkit demo` and commit what it measured to `results/demo-<algo>.json` (or `demo-<task>.json`).

The README's measured-result block is rendered from these files (`scripts/render_results.py`), so a
figure there always names the commit and command it came from. Each file holds the demo's own
`metrics.json` plus `commit` (short hash, `-dirty` when `src/` had uncommitted changes), `command`,
`date` and the machine (CPU, cores, torch threads, load average before and after: wall times on a
shared machine are noisy; the metric figures are deterministic).

    python scripts/record_demo_result.py --algo rloo            # runs `rlhfkit demo`, then records
    python scripts/record_demo_result.py --algo dpo --no-run    # records outputs/demo as it is
    python scripts/record_demo_result.py --task addition        # the verifiable task (GRPO)

Stdlib only: the demo runs in a subprocess (`python -m rlhfkit demo`), with this interpreter.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path = ROOT) -> str:
    """Short hash of HEAD, with `-dirty` when `src/` (the measured code) has uncommitted changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    changes = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()
    return head + ("-dirty" if changes else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def demo_command(algo: str, extra: list[str], task: str = "sentiment") -> list[str]:
    """The `rlhfkit demo` flags of this record: the default demo is plain `rlhfkit demo`."""
    if task != "sentiment":  # a verifiable task runs its own algorithm (GRPO)
        return ["--task", task, *extra]
    return (["--algo", algo] if algo != "rloo" else []) + extra


def build_record(metrics: dict, command: str, commit: str, load_before, load_after, note: str) -> dict:
    threads = metrics.get("config", {}).get("num_threads")
    return {
        "command": command,
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": threads,
            "python": platform.python_version(),
            "load_average_before": None if load_before is None else [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "note": note,
        },
        "metrics": metrics,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="rloo", choices=("rloo", "ppo", "ppo-multi-adapter", "dpo"))
    parser.add_argument("--task", default="sentiment", help="The demo task; not sentiment: --algo is ignored.")
    parser.add_argument("--output_dir", default="outputs/demo", help="The demo's output folder (its cache).")
    parser.add_argument("--no-run", action="store_true", help="Record the finished run in --output_dir.")
    parser.add_argument("--note", default="shared machine", help="Words on the machine's state.")
    parser.add_argument("--results", default=str(ROOT / "results"), help="Folder of the result files.")
    args, extra = parser.parse_known_args(argv)
    flags = demo_command(args.algo, extra, args.task)
    if args.output_dir != "outputs/demo":
        flags += ["--output_dir", args.output_dir]
    command = " ".join(["rlhfkit demo", *flags])
    commit = git_commit()
    load_before = None if args.no_run else os.getloadavg()  # --no-run: the run's load is unknown
    if not args.no_run:
        subprocess.run([sys.executable, "-m", "rlhfkit", "demo", *flags], cwd=ROOT, check=True)
    metrics_path = ROOT / args.output_dir / "metrics.json"
    if not metrics_path.is_file():
        parser.error(f"--output_dir: no metrics.json in {args.output_dir} (run the demo first)")
    metrics = json.loads(metrics_path.read_text("utf-8"))
    ran = metrics.get("config", {})
    if ran.get("task", "sentiment") != args.task:
        parser.error(f"--task {args.task}: {metrics_path} holds a run of the {ran.get('task')} task")
    if args.task == "sentiment" and ran.get("algo") != args.algo:
        parser.error(f"--algo {args.algo}: {metrics_path} holds a run of {ran.get('algo')}")
    record = build_record(metrics, command, commit, load_before, os.getloadavg(), args.note)
    out = Path(args.results) / f"demo-{args.algo if args.task == 'sentiment' else args.task}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out} (commit {commit}); now run `make results` to render README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
