"""Run `rlhfkit demo` and commit what it measured to `results/demo-<algo>.json` (or `demo-<task>.json`).

The README's measured-result block is rendered from these files (`scripts/render_results.py`), so a
figure there always names the commit and command it came from. Each file holds the demo's own
`metrics.json` plus `commit` (short hash, `-dirty` when `src/` had uncommitted changes), `command`,
`date` and the machine (CPU, cores, torch threads, load average before and after: wall times on a
shared machine are noisy; the metric figures are deterministic).

    python scripts/record_demo_result.py --algo rloo            # runs `rlhfkit demo`, then records
    python scripts/record_demo_result.py --algo dpo --no-run    # records outputs/demo as it is
    python scripts/record_demo_result.py --task addition        # the verifiable task (GRPO)

    python scripts/record_demo_result.py --algo rloo --check     # a fresh run against the record

`--check` runs the demo afresh in a temporary folder and compares every figure of its metrics.json (the
evaluation, every stage's summary, the config) with the committed record: exactly when this machine's
arithmetic matches the record's (`platform`: CPU, torch's kernel set, library versions), else within the
spread measured by `scripts/measure_demo_spread.py` (`results/demo-<name>-spread.json`). Exit 1 on
any difference, each one named.

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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# figures a run may change without changing what it computed: wall times, cache use, its own folder
UNCOMPARED = {"seconds", "reused", "total_seconds", "output_dir", "fresh", "source"}
PLATFORM_PROBE = """
import importlib.metadata as md, json, platform, torch
names = ("transformers", "tokenizers", "accelerate", "peft", "datasets", "numpy", "vaderSentiment")
print(json.dumps({"machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "torch": torch.__version__, **{n: md.version(n) for n in names}}))
"""


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


def platform_fingerprint(python: str = sys.executable) -> dict:
    """What decides the demo's arithmetic: the CPU, torch's kernel set and the library versions.

    Two machines with the same fingerprint give the same figures bit for bit. Another CPU can round a
    matrix product differently in its last bit, which flips a sampled token now and then, and the run
    diverges from there (an Intel Xeon and an AMD EPYC gave 83.8% and 75.0% for the same commit).
    """
    probe = subprocess.run([python, "-c", PLATFORM_PROBE], capture_output=True, text=True, check=True)
    return {"cpu": cpu_name(), **json.loads(probe.stdout)}


def figures(metrics: dict) -> dict[str, object]:
    """Every compared figure of a metrics.json, flattened: {"evaluation.win_rate_rl_vs_sft": 0.75, ...}."""
    flat: dict[str, object] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key not in UNCOMPARED:
                    walk(f"{prefix}.{key}" if prefix else key, item)
        elif key_is_summary(prefix):
            flat[prefix] = value

    walk("", {k: metrics[k] for k in ("config", "evaluation", "stages") if k in metrics})
    return flat


def key_is_summary(key: str) -> bool:
    """Stage entries compare their summary and config hash, not their bookkeeping."""
    parts = key.split(".")
    if parts[0] != "stages":
        return True
    # the evaluation stage's summary is the top-level "evaluation" block again
    return parts[1] != "evaluation" and len(parts) > 2 and parts[2] in ("summary", "config_hash")


def differences(recorded: dict, fresh: dict, tolerance: dict[str, float] | None = None) -> list[str]:
    """One line per figure that differs: missing on a side, or off by more than its tolerance.

    Without `tolerance` numbers must be equal; with it, a number (or each number of a list) may move by its
    figure's tolerance (0 when not listed) and a yes/no figure may flip. The config and the config hashes
    are always compared exactly.
    """
    problems = []
    for key in sorted(set(recorded) | set(fresh)):
        if key not in fresh or key not in recorded:
            problems.append(f"{key}: {'only in the record' if key in recorded else 'not in the record'}")
            continue
        old, new = recorded[key], fresh[key]
        exact = tolerance is None or key.startswith("config.") or key.endswith("config_hash")
        allowed = 0.0 if exact else tolerance.get(key, 0.0)
        olds, news = numbers_of(old), numbers_of(new)
        if olds is not None and news is not None:
            differ = len(olds) != len(news) or any(
                abs(b - a) > allowed + 1e-12 * max(1.0, abs(a)) for a, b in zip(olds, news)
            )
        else:  # text, or a yes/no figure, which may flip under a tolerance
            differ = old != new and (exact or not isinstance(old, bool))
        if differ:
            note = f" (tolerance {allowed:.3g})" if allowed else ""
            problems.append(f"{key}: record {old!r}, this run {new!r}{note}")
    return problems


def numbers_of(value) -> list[float] | None:
    """A figure's numbers: [x] for a number, the list for a list of numbers (an interval), else None."""
    values = value if isinstance(value, list) else [value]
    is_number = [isinstance(v, int | float) and not isinstance(v, bool) for v in values]
    return values if values and all(is_number) else None


def record_name(algo: str, task: str, flags: list[str] = ()) -> str:
    """`rloo`, `addition`...; a run of another seed than 0 gets its own file (`calculator-seed1`)."""
    name = algo if task == "sentiment" else task
    seed = next((flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--seed"), "0")
    seed = next((f.split("=", 1)[1] for f in flags if f.startswith("--seed=")), seed)
    return name if int(seed) == 0 else f"{name}-seed{int(seed)}"


def build_record(
    metrics: dict, command: str, commit: str, load_before, load_after, note: str, platform_: dict
) -> dict:
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
        "platform": platform_,
        "metrics": metrics,
    }


def load_tolerance(results: Path, name: str) -> dict[str, float] | None:
    """Per-figure tolerance for a run on another platform: twice the spread measured across arithmetic
    variants (`scripts/measure_demo_spread.py`); None when no spread was measured for this record."""
    path = results / f"demo-{name}-spread.json"
    if not path.is_file():
        return None
    spread = json.loads(path.read_text("utf-8"))["spread"]
    return {key: SPREAD_MARGIN * value for key, value in spread.items()}


SPREAD_MARGIN = 2.0  # a few variants see only part of the spread another CPU can give


def run_fresh(flags: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> dict:
    """metrics.json of a demo run with `flags`, afresh in a temporary folder (no cached stage),
    under `env`."""
    with tempfile.TemporaryDirectory(prefix="demo-fresh-") as tmp:
        command = [sys.executable, "-m", "rlhfkit", "demo", *flags, "--output_dir", tmp, "--fresh"]
        subprocess.run(command, cwd=ROOT, env={**os.environ, **(env or {})}, check=True, capture_output=quiet)
        return json.loads((Path(tmp) / "metrics.json").read_text("utf-8"))


def check(name: str, flags: list[str], results: Path) -> int:
    """Run the demo afresh and compare its figures with results/demo-<name>.json; 0 when they agree."""
    record = json.loads((results / f"demo-{name}.json").read_text("utf-8"))
    fresh = figures(run_fresh(flags))
    here = platform_fingerprint()
    same = record.get("platform") == here
    tolerance = None if same else load_tolerance(results, name)
    if same:
        how = "exactly (same platform as the record)"
    elif tolerance is None:
        how = "exactly (another platform, and no measured spread for this record)"
    else:
        how = (
            f"within {SPREAD_MARGIN:g}x the measured spread "
            f"(another platform: {platform_change(record, here)})"
        )
    problems = differences(figures(record["metrics"]), fresh, tolerance)
    print(f"demo-{name}: {len(fresh)} figures compared {how}")
    for line in problems:
        print(f"  {line}")
    if problems:
        print(
            f"demo-{name}: {len(problems)} figures differ from results/demo-{name}.json "
            f"(commit {record['commit']}); if the change is intended, re-record: "
            f"python scripts/record_demo_result.py {' '.join(flags)}"
        )
    return 1 if problems else 0


def platform_change(record: dict, here: dict) -> str:
    old = record.get("platform") or {}
    changed = [
        f"{key} {old.get(key)!r} -> {here.get(key)!r}"
        for key in sorted(set(old) | set(here))
        if old.get(key) != here.get(key)
    ]
    return "; ".join(changed) or "the record names none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="rloo", choices=("rloo", "ppo", "ppo-multi-adapter", "dpo"))
    parser.add_argument(
        "--task", default="sentiment", help="The demo task; not sentiment: --algo is ignored."
    )
    parser.add_argument("--output_dir", default="outputs/demo", help="The demo's output folder (its cache).")
    parser.add_argument("--no-run", action="store_true", help="Record the finished run in --output_dir.")
    parser.add_argument(
        "--check", action="store_true", help="Run afresh and compare with the record; write nothing."
    )
    parser.add_argument("--note", default="shared machine", help="Words on the machine's state.")
    parser.add_argument("--results", default=str(ROOT / "results"), help="Folder of the result files.")
    args, extra = parser.parse_known_args(argv)
    name = record_name(args.algo, args.task, extra)
    flags = demo_command(args.algo, extra, args.task)
    if args.check:
        return check(name, flags, Path(args.results))
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
    if any(stage.get("reused") for stage in metrics.get("stages", {}).values()):
        print(
            "note: some stages were reused from the cache; `--check` will tell whether they match this code"
        )
    record = build_record(
        metrics, command, commit, load_before, os.getloadavg(), args.note, platform_fingerprint()
    )
    out = Path(args.results) / f"demo-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out} (commit {commit}); now run `make results` to render README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
