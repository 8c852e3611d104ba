"""benchmarks/grpo_bench.py's arithmetic: medians, ratios, the speed verdict and the length distribution."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _grpo_bench():
    sys.path.insert(0, str(BENCH))  # grpo_bench imports run.py from there
    try:
        spec = importlib.util.spec_from_file_location("bench_grpo_bench", BENCH / "grpo_bench.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _run(library: str, eps: float, cpu: float, rss: float, lengths: list[int]) -> dict:
    return {
        "library": library,
        "workload": "grpo",
        "model": "tiny",
        "mode": "eos",
        "episodes_per_second": eps,
        "cpu_seconds_per_step": cpu,
        "os_peak_rss_mb": rss,
        "load_average_before": 3.0,
        "completion_lengths": {"all": lengths},
    }


def _data(runs: list[dict]) -> dict:
    return {"info": {}, "import_baselines": {"rlhfkit/grpo": 400.0, "trl/grpo": 420.0}, "runs": runs}


def test_medians_ratios_and_lengths():
    bench = _grpo_bench()
    runs = [_run("rlhfkit", e, 0.5, r, [4, 48]) for e, r in ((30.0, 500.0), (31.0, 490.0), (90.0, 510.0))]
    runs += [_run("trl", e, 1.0, 520.0, [1, 48, 48]) for e in (10.0, 20.0, 15.0)]
    (row,) = bench.summarize(_data(runs))
    assert row["rlhfkit"]["completions_per_second"] == 31.0 and row["trl"]["completions_per_second"] == 15.0
    assert abs(row["speed_ratio"] - 31.0 / 15.0) < 1e-12 and row["cpu_ratio"] == 2.0
    assert row["speed_ok"] and row["memory_ok"] and row["rlhfkit"]["loop_rss_mb"] == 100.0
    assert row["rlhfkit"]["lengths"] == {"min": 4, "median": 26.0, "mean": 26.0, "max": 48, "n": 6}
    assert row["trl"]["lengths"]["median"] == 48 and row["trl"]["lengths"]["min"] == 1


def test_wall_clock_alone_does_not_meet_the_speed_target():
    """A 2x wall-clock ratio with equal CPU time per step is load noise, not a met target."""
    bench = _grpo_bench()
    runs = [_run("rlhfkit", 40.0, 1.0, 500.0, [48]), _run("trl", 20.0, 1.0, 490.0, [48])]
    data = _data(runs)
    (row,) = bench.summarize(data)
    assert row["speed_ratio"] == 2.0 and not row["speed_ok"] and not row["memory_ok"]
    data["info"] = {
        "date": "d",
        "machine": "m",
        "commit": "c",
        "command": "x",
        "versions": "v",
        "trl_version": "t",
        "rlhfkit_file": "f",
        "threads": 2,
        "warmup": 1,
        "load": "3.0 to 3.0",
    }
    text = bench.markdown(data)
    assert (
        "2.00x / 1.00x NOT MET" in text
        and "Speed target met in 0 of 1 settings; memory target met in 0 of 1" in text
    )


def test_run_args_carry_everything_the_shared_runner_reads():
    """grpo_bench runs each side through run.py's run_one: a setting run_one starts reading must reach it."""
    bench = _grpo_bench()
    read = set(re.findall(r"\bargs\.(\w+)", inspect.getsource(bench.bench.run_one)))
    read |= set(re.findall(r"\bargs\.(\w+)", inspect.getsource(bench.bench.venv_python)))
    parsed = bench.parse_args([])
    parsed.rlhfkit_python = "python"  # main() sets it (a wrapper script) before any run
    args = bench.run_args(parsed, "tiny", "eos")
    assert read and not read - set(vars(args)), f"run_args lacks {sorted(read - set(vars(args)))}"
    assert args.eos and args.max_rss_gb == 20.0
