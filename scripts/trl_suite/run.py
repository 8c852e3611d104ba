"""Run TRL's trainer test files against rlhfkit and write the pass rate (issue 33's yardstick).

    PYTHONPATH=$PWD/src python scripts/trl_suite/run.py \
        --trl-tests /work/trl-tests/main /work/trl-tests/v0.11.4 --out results/trl_suite.json

Each folder holds a `tests/` folder from TRL (see get_tests.py) and a TRL_COMMIT file. Every test
file runs in its own pytest process with `trl` replaced by the shim (shim/trl: rlhfkit's names),
hub ids replaced by local stand-ins (plugin.py), TRL's conftest switched off and a per-test timeout.
The denominator is the CPU-runnable tests: all tests less those skipped as not CPU-runnable, skipped
for a missing optional package, skipped by TRL itself, or expected to fail (xfail) upstream.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from causes import cause_of, theme_of  # noqa: E402
from plugin import _NOT_CPU_REASONS, NOT_CPU  # noqa: E402

NOT_PASSED = ("failed", "error", "harness_unmapped")


def _rlhfkit_commit() -> str:
    """HEAD of the git checkout that `import rlhfkit` resolves to, `-dirty` if tracked files changed."""
    import rlhfkit

    repo = Path(rlhfkit.__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _environment(tmp: Path, outcomes: Path, deps: str | None) -> dict[str, str]:
    shutil.copytree(HERE / "shim", tmp / "shim", dirs_exist_ok=True)
    path = [str(tmp / "shim"), str(HERE), os.environ.get("PYTHONPATH", ""), deps or ""]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), TRL_SUITE_OUTCOMES=str(outcomes))
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
        HF_DATASETS_CACHE=str(tmp / "hf-datasets"), WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
    )  # fmt: skip
    return env


def run_file(folder: Path, test_file: str, args: argparse.Namespace) -> dict:
    """Run one TRL test file; returns node id -> {"outcome", "reason"}."""
    with tempfile.TemporaryDirectory(prefix="trl-suite-") as tmp_name:
        tmp = Path(tmp_name)
        outcomes = tmp / "outcomes.json"
        command = [
            sys.executable, "-m", "pytest", f"tests/{test_file}", "-p", "plugin", "--noconftest",
            "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--no-header", "-rN", "-p", "no:randomly",
            f"--timeout={args.timeout}", f"--basetemp={tmp / 'pytest'}", *args.pytest_args,
        ]  # fmt: skip
        env = _environment(tmp, outcomes, args.deps)
        try:
            done = subprocess.run(
                command, cwd=folder, env=env, timeout=args.file_timeout, capture_output=True, text=True
            )
            tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
            stopped = None
        except subprocess.TimeoutExpired:
            stopped = tail = [f"file stopped after {args.file_timeout} s; its remaining tests did not run"]
        print(f"{folder.name}/{test_file}: {' '.join(tail)}", flush=True)
        found = json.loads(outcomes.read_text(encoding="utf-8")) if outcomes.is_file() else {}
        if stopped or not found:
            found[f"tests/{test_file}"] = {"outcome": "error", "reason": f"run.py: {' '.join(tail)}"}
        return found


def category(entry: dict) -> str:
    outcome, reason = entry["outcome"], entry["reason"]
    if outcome in ("failed", "error") and "HarnessUnmapped" in reason:
        return "harness_unmapped"
    if outcome == "skipped":
        if reason.startswith(NOT_CPU) or _NOT_CPU_REASONS.search(reason):  # ours, or TRL's own marker
            return "skipped_not_cpu"
        if reason.startswith("test requires"):
            return "skipped_missing_package"
        return "skipped_by_trl"
    return outcome  # passed, failed, error, xfailed, xpassed


def summarise(results: dict[str, dict]) -> dict:
    counts = Counter(category(entry) for entry in results.values())
    counts["passed"] += counts.pop("xpassed", 0)
    runnable = sum(counts[key] for key in ("passed", *NOT_PASSED))
    mapped = runnable - counts["harness_unmapped"]
    return {
        "tests": len(results),
        "cpu_runnable": runnable,
        "passed": counts["passed"],
        "pass_rate": round(counts["passed"] / runnable, 4) if runnable else None,
        "pass_rate_of_mapped": round(counts["passed"] / mapped, 4) if mapped else None,
        **{key: counts[key] for key in sorted(counts) if key != "passed"},
    }


def report(results: dict[str, dict], per_file: dict[str, dict]) -> dict:
    failing = {node: entry for node, entry in sorted(results.items()) if category(entry) in NOT_PASSED}
    causes = Counter(cause_of(entry["reason"]) for entry in failing.values())
    themes = Counter(theme_of(entry["reason"]) for entry in failing.values())
    return {
        "total": summarise(results),
        "per_file": {name: summarise(file_results) for name, file_results in sorted(per_file.items())},
        "failure_themes": [
            {"theme": theme, "tests": n} for theme, n in sorted(themes.items(), key=lambda c: (-c[1], c[0]))
        ],
        "failure_causes": [
            {"cause": cause, "tests": n} for cause, n in sorted(causes.items(), key=lambda c: (-c[1], c[0]))
        ],
        "failing": [
            {"test": node, "category": category(entry), "reason": entry["reason"]}
            for node, entry in failing.items()
        ],
        "passed": [node for node, entry in sorted(results.items()) if category(entry) == "passed"],
        "skipped": {
            node: entry["reason"] for node, entry in sorted(results.items()) if entry["outcome"] == "skipped"
        },
    }


def _test_files(folders: list[Path], wanted: list[str] | None) -> list[tuple[Path, str]]:
    """(folder, file name) pairs, shortest file first, so a run cut short loses the fewest files."""
    paths = [path for folder in folders for path in (folder / "tests").glob("test_*.py")]
    paths = [path for path in paths if not wanted or path.name in wanted]
    paths.sort(key=lambda path: (path.stat().st_size, path.name))
    return [(path.parent.parent, path.name) for path in paths]


def _command(argv: list[str], deps: str | None) -> str:
    """The command line to record, with the extra-packages folder when it came from the environment."""
    env = f"TRL_SUITE_DEPS={deps} " if deps and "--deps" not in argv else ""
    return f"{env}PYTHONPATH=src python scripts/trl_suite/run.py " + " ".join(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trl-tests", nargs="+", required=True, type=Path, help="folders holding TRL's tests/ folder"
    )
    parser.add_argument("--files", nargs="*", help="only these test files (e.g. test_dpo_trainer.py)")
    parser.add_argument("--out", type=Path, help="the JSON result file to write")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (pytest-timeout)")
    parser.add_argument("--file-timeout", type=int, default=3600, help="seconds per test file")
    parser.add_argument(
        "--deps",
        default=os.environ.get("TRL_SUITE_DEPS"),
        help="folder with extra test packages TRL's tests import (parameterized), added to the path",
    )
    parser.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[], help="passed on to pytest")
    args = parser.parse_args(argv)
    commit = _rlhfkit_commit()  # the code under test: read before the run, which edits nothing
    results, per_file, trl_commits = {}, {}, {}
    folders = [path.resolve() for path in args.trl_tests]
    for folder in folders:
        commit_file = folder / "TRL_COMMIT"
        trl_commits[folder.name] = commit_file.read_text().strip() if commit_file.is_file() else "unknown"
    for folder, test_file in _test_files(folders, args.files):
        file_results = run_file(folder, test_file, args)
        file_results = {f"{folder.name}/{node}": entry for node, entry in file_results.items()}
        per_file[f"{folder.name}/{test_file}"] = dict(sorted(file_results.items()))
        results.update(file_results)
    record = {
        "command": _command(argv or sys.argv[1:], args.deps),
        "commit": commit,
        "trl_commits": trl_commits,
        "date": datetime.date.today().isoformat(),
        "per_test_timeout_s": args.timeout,
        **report(results, per_file),
    }
    print(json.dumps(record["total"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
