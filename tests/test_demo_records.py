"""The committed demo records hold what the code computes today.

`tests/test_results_fresh.py` checks that README.md and docs/ say what results/*.json say; this file checks
that those files say what a fresh run says. The slow tests run the default demo and the addition demo
afresh (`scripts/record_demo_result.py --check`) and compare every figure with its record: exactly on the
record's platform, within twice the measured spread elsewhere. `make records-check` does the same for
every record.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


records = _script("record_demo_result")
spread = _script("measure_demo_spread")

METRICS = {
    "config": {"algo": "rloo", "kl_coef": 0.15, "output_dir": "outputs/demo", "fresh": False},
    "evaluation": {"win_rate_rl_vs_sft": 0.8, "win_rate_ci95": [0.75, 0.85], "judges_agree": True},
    "stages": {
        "sft": {"summary": {"final_loss": 0.55, "source": "/root/x"}, "seconds": 20.1, "config_hash": "ab"},
        "evaluation": {"summary": {"win_rate_rl_vs_sft": 0.8}, "seconds": 3.0, "config_hash": "cd"},
    },
    "total_seconds": 70.0,
}


def test_figures_keep_results_and_drop_times_paths_and_the_repeated_evaluation():
    assert records.figures(METRICS) == {
        "config.algo": "rloo",
        "config.kl_coef": 0.15,
        "evaluation.win_rate_rl_vs_sft": 0.8,
        "evaluation.win_rate_ci95": [0.75, 0.85],
        "evaluation.judges_agree": True,
        "stages.sft.summary.final_loss": 0.55,
        "stages.sft.config_hash": "ab",
    }


def test_exact_comparison_names_every_difference():
    old = records.figures(METRICS)
    new = {**old, "evaluation.win_rate_rl_vs_sft": 0.8000001, "evaluation.win_rate_ci95": [0.75, 0.86]}
    del new["stages.sft.summary.final_loss"]
    new["evaluation.extra"] = 1
    assert records.differences(old, old) == []
    problems = records.differences(old, new)
    assert [p.split(":")[0] for p in problems] == [
        "evaluation.extra",
        "evaluation.win_rate_ci95",
        "evaluation.win_rate_rl_vs_sft",
        "stages.sft.summary.final_loss",
    ]
    assert "record 0.8, this run 0.8000001" in problems[2]


def test_tolerance_applies_to_listed_figures_only_and_never_to_the_config():
    old = records.figures(METRICS)
    new = {
        **old,
        "evaluation.win_rate_rl_vs_sft": 0.83,
        "evaluation.win_rate_ci95": [0.77, 0.88],
        "evaluation.judges_agree": False,
    }
    tolerance = {"evaluation.win_rate_rl_vs_sft": 0.04, "evaluation.win_rate_ci95": 0.03}
    assert records.differences(old, new, tolerance) == []  # a yes/no figure may flip under a tolerance
    assert len(records.differences(old, new)) == 3
    off = {**new, "evaluation.win_rate_rl_vs_sft": 0.85}
    assert records.differences(old, off, tolerance) == [
        "evaluation.win_rate_rl_vs_sft: record 0.8, this run 0.85 (tolerance 0.04)"
    ]
    changed_config = {**old, "config.kl_coef": 0.1}
    assert records.differences(old, changed_config, {"config.kl_coef": 1.0}) != []


def test_spread_is_the_largest_distance_of_any_variant_from_the_plain_run():
    runs = {
        "plain": {"a": 1.0, "ci": [0.1, 0.3], "name": "x"},
        "v1": {"a": 1.5, "ci": [0.1, 0.2], "name": "x"},
        "v2": {"a": 0.25, "ci": [0.15, 0.3], "name": "y"},
    }
    assert spread.spread(runs) == {"a": 0.75, "ci": pytest.approx(0.1)}


def test_tolerance_is_twice_the_committed_spread(tmp_path):
    (tmp_path / "demo-rloo-spread.json").write_text(json.dumps({"spread": {"evaluation.kl_rl_to_sft": 0.5}}))
    assert records.load_tolerance(tmp_path, "rloo") == {"evaluation.kl_rl_to_sft": 1.0}
    assert records.load_tolerance(tmp_path, "dpo") is None


def test_every_record_names_its_platform():
    for path in sorted((ROOT / "results").glob("demo-*.json")):
        if path.name.endswith("-spread.json"):
            assert (ROOT / "results" / path.name.replace("-spread", "")).is_file(), f"{path.name}: no record"
            continue
        platform = json.loads(path.read_text())["platform"]
        assert platform["cpu"] and platform["torch"] and platform["cpu_capability"], path.name


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--algo", "rloo"], ["--task", "addition"]], ids=["default", "addition"])
def test_a_fresh_demo_run_matches_its_record(flags):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_demo_result.py"), *flags, "--check"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    report = "\n".join(line for line in result.stdout.splitlines() if line.startswith(("demo-", "  ")))
    assert result.returncode == 0, f"{report}\n{result.stderr[-3000:]}"
    assert "figures compared" in report
