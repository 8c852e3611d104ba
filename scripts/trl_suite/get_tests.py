"""Extract the TRL test files the suite runs from a TRL git checkout, into folders outside rlhfkit.

    python scripts/trl_suite/get_tests.py --git-dir /path/to/trl/.git --out /work/trl-tests

writes OUT/main/tests/... (the newest commit of `main`, or --main-ref) and OUT/v0.11.4/tests/...
(tag v0.11.4), each folder with a TRL_COMMIT file that run.py records. TRL's code stays out of
this repository: the harness only ever takes the folder's path.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tarfile
from pathlib import Path

SUPPORT = ["tests/__init__.py", "tests/testing_utils.py", "tests/testing_constants.py"]
MAIN_FILES = [
    "tests/conftest.py", "tests/data", "tests/test_grpo_trainer.py", "tests/test_rloo_trainer.py",
    "tests/test_dpo_trainer.py", "tests/test_sft_trainer.py", "tests/test_reward_trainer.py",
]  # fmt: skip
OLD_FILES = ["tests/test_ppo_trainer.py", "tests/test_modeling_value_head.py"]


def _git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout


def extract(git_dir: str, ref: str, paths: list[str], out: Path) -> str:
    """Write `paths` at `ref` under `out` and return the full commit hash."""
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").decode().strip()
    archive = _git(git_dir, "archive", "--format=tar", commit, *paths)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    (out / "TRL_COMMIT").write_text(f"{commit} ({ref})\n", encoding="utf-8")
    return commit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="a TRL clone's .git folder (or a bare mirror)")
    parser.add_argument("--out", required=True, type=Path, help="folder to write main/ and v0.11.4/ into")
    parser.add_argument("--main-ref", default="main", help="the ref for the five current trainer test files")
    parser.add_argument("--old-ref", default="v0.11.4", help="the ref for the PPO and value-head test files")
    args = parser.parse_args(argv)
    print("main:", extract(args.git_dir, args.main_ref, SUPPORT + MAIN_FILES, args.out / "main"))
    print("old:", extract(args.git_dir, args.old_ref, SUPPORT + OLD_FILES, args.out / "v0.11.4"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
