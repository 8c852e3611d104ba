"""GRPO speed and memory, rlhfkit against the newest TRL (GitHub issue 17, "Benchmarks", speed bullet).

    python benchmarks/grpo_bench.py [--models tiny,small] [--workloads grpo,grpo-kl] [--modes fixed,eos]
                                    [--repeats 3] [--render benchmarks/grpo_results.json]

Uses run.py's machinery (the workloads/{rlhfkit,trl}_grpo*.py scripts, one subprocess per run, 2 threads,
peak RSS from the OS, import-only baselines): every (repeat, mode, model, workload) runs for both libraries
back to back, alternating which goes first. The rlhfkit side imports this checkout's src/ (a small wrapper
interpreter puts it first on the path). Writes benchmarks/grpo_results.json (every run) and
benchmarks/GRPO_RESULTS.md (rendered from the JSON by `markdown`); both are rewritten after every run.

Equal work (the settings are in workloads/_grpo_loop.py): the same model folders (identical logits in every
venv, parity.py), the same 256 prompts of exactly 16 tokens and the same reward function; with beta=0.04
both load the reference from the same folder in float32 and weight the KL by the ratio
(`use_bias_correction_kl`, both defaults). TRL-only options are set to rlhfkit's behaviour (`use_vllm`,
`use_liger_kernel`, `use_transformers_paged`, `cast_lm_head_to_fp32`, `disable_dropout` off; no completion
logging, evaluation or saving); both sides still compute their per-step metrics. Not matched: the random
streams (prompt order, token draws), so with eos stopping the two length distributions are reported side by
side. Speed counts the timed steps only, after one warm-up step. Each rlhfkit side runs in a venv with the
optional packages of the TRL venv it is compared with (setup_trl.sh): transformers imports Pillow whenever
it is installed, +17 MiB on the import-only baseline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (run.py sets OMP_WAIT_POLICY before torch is imported)

STEPS = {"tiny": 12, "small": 5}  # timed steps per run: a tiny step is ~10x shorter
MODES = ("fixed", "eos")
SPEED_TARGET = 1.5


def rlhfkit_wrapper(work_dir: Path) -> str:
    """An interpreter for the rlhfkit venv with this checkout's src/ first (run.py's children drop
    PYTHONPATH)."""
    venv = bench.VENVS / "rlhfkit" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    wrapper = work_dir / "grpo-bench-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{HERE.parent / "src"}" exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def run_args(args: argparse.Namespace, model: str, mode: str) -> argparse.Namespace:
    return argparse.Namespace(
        rlhfkit_python=args.rlhfkit_python,
        work_dir=args.work_dir,
        steps=STEPS[model],
        warmup=args.warmup,
        seed=args.seed,
        threads=args.threads,
        eos=mode == "eos",
        timeout=args.timeout,
        max_rss_gb=args.max_rss_gb,
        libraries=list(bench.LIBRARIES),
    )


def measure(args: argparse.Namespace, data: dict) -> None:
    log_dir = args.work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    started, first = time.monotonic(), 1 + max((r["repeat"] for r in data["runs"]), default=-1)
    for repeat in range(first, first + args.repeats):
        order = list(bench.LIBRARIES) if repeat % 2 == 0 else list(reversed(bench.LIBRARIES))
        for mode in args.modes:
            for model in args.models:
                for name in args.workloads:
                    if args.time_budget and time.monotonic() - started > 60 * args.time_budget:
                        data["info"]["note"] = (
                            f"--time-budget {args.time_budget} min cut the last repeat(s) short"
                        )
                        return
                    for library in order:
                        bench.log(
                            f"repeat {repeat + 1}/{first + args.repeats} {mode} {model} {name} {library} ..."
                        )
                        result = bench.run_one(
                            library, bench.WORKLOADS[name], model, run_args(args, model, mode), log_dir
                        )
                        result.update(repeat=repeat, mode=mode, load_average_after=list(os.getloadavg()))
                        if "error" in result:
                            bench.log(f"  FAILED ({result['error']}): {result.get('tail', '')}")
                        else:
                            bench.log(
                                f"  {result['episodes_per_second']:.2f} completions/s, peak "
                                f"{result['os_peak_rss_mb']:.0f} MiB (load "
                                f"{result['load_average_before']:.1f})"
                            )
                        data["runs"].append(result)
                        write(args.output_dir, data)


def summarize(data: dict) -> list[dict]:
    """Medians per (mode, model, workload, library), the rlhfkit/TRL ratios and whether the targets are
    met."""
    runs = [r for r in data["runs"] if "error" not in r]
    keys = sorted(
        {(r["mode"], r["model"], r["workload"]) for r in data["runs"]},
        key=lambda k: (MODES.index(k[0]), ("tiny", "small").index(k[1]), k[2]),
    )
    rows = []
    for mode, model, workload in keys:
        row: dict = {"mode": mode, "model": model, "workload": workload}
        for library in bench.LIBRARIES:
            ok = [
                r
                for r in runs
                if (r["mode"], r["model"], r["workload"], r["library"]) == (mode, model, workload, library)
            ]
            if not ok:
                continue
            lengths = [n for r in ok for n in r["completion_lengths"]["all"]]
            base = data["import_baselines"].get(f"{library}/{workload}")
            peak = statistics.median(r["os_peak_rss_mb"] for r in ok)
            row[library] = {
                "runs": len(ok),
                "completions_per_second": statistics.median(r["episodes_per_second"] for r in ok),
                "all_completions_per_second": [round(r["episodes_per_second"], 3) for r in ok],
                "cpu_seconds_per_step": statistics.median(r["cpu_seconds_per_step"] for r in ok),
                "peak_rss_mb": peak,
                "import_rss_mb": base,
                "loop_rss_mb": None if base is None else peak - base,
                "lengths": {
                    "min": min(lengths),
                    "median": statistics.median(lengths),
                    "mean": statistics.fmean(lengths),
                    "max": max(lengths),
                    "n": len(lengths),
                },
            }
        if "rlhfkit" in row and "trl" in row:
            k, t = row["rlhfkit"], row["trl"]
            row["speed_ratio"] = k["completions_per_second"] / t["completions_per_second"]
            row["cpu_ratio"] = t["cpu_seconds_per_step"] / k["cpu_seconds_per_step"]
            row["memory_ratio"] = k["peak_rss_mb"] / t["peak_rss_mb"]
            # wall clock on a shared machine swings both ways: the target counts as met only when the
            # CPU-time ratio (disturbed less by other processes) agrees
            row["speed_ok"] = min(row["speed_ratio"], row["cpu_ratio"]) >= SPEED_TARGET
            row["memory_ok"] = row["memory_ratio"] <= 1.0
        rows.append(row)
    return rows


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _runs(d: dict) -> str:
    return ", ".join(f"{x:.1f}" for x in d.get("all_completions_per_second", [])) or "-"


def _lengths(d: dict) -> str:
    n = d.get("lengths")
    return "-" if not n else f"{n['min']} / {n['median']:g} / {n['mean']:.1f} / {n['max']}"


def markdown(data: dict) -> str:
    info, rows = data["info"], summarize(data)
    out = [
        "# GRPO: rlhfkit vs TRL (speed and memory)",
        "",
        f"Measured {info['date']} on {info['machine']}, commit {info['commit']}"
        + ("" if info.get("complete") else " (INCOMPLETE: still running or interrupted)")
        + f". Command: `{info['command']}`",
        "",
        f"Versions: {info['versions']}; TRL side: {info['trl_version']}. rlhfkit imported from "
        f"`{info['rlhfkit_file']}`.",
        "",
        f"{info['threads']} threads per run, one subprocess per run, steps timed after {info['warmup']} "
        f"warm-up step(s) ({', '.join(f'{m}: {s}' for m, s in STEPS.items())} timed steps), median of the "
        "repeats, the two libraries of a pair back to back and alternating which goes first. Load average "
        f"(1 min) seen before the runs: {info['load']}; the machine is shared with other jobs, so absolute "
        "times are noisy and the CPU-time ratio (TRL's CPU seconds per step over rlhfkit's) is given as a "
        "cross-check." + (f" Note: {info['note']}." if info.get("note") else ""),
        "",
        "Workload (workloads/_grpo_loop.py): 16 completions per optimizer step (4 prompts x "
        "num_generations=4, micro-batch 4 x gradient accumulation 4), at most 48 new tokens, temperature 1, "
        "loss_type `dapo`, float32, no gradient checkpointing, a rule reward (a Python function), `grpo`: "
        "beta=0 (no reference model), `grpo-kl`: beta=0.04. `fixed`: every completion is forced to 48 "
        "tokens (`min_new_tokens`); `eos`: generation stops at the eos token. Lengths are min / median / "
        "mean / max over every timed completion of every run.",
        "",
        f"Targets (issue 17): completions per second >= {SPEED_TARGET}x TRL's, peak memory no higher.",
        "",
        "The speed target counts as met only where both the wall-clock ratio and the CPU-time ratio "
        "reach it.",
        "",
        "| mode | model | workload | rlhfkit compl/s | TRL compl/s | speed ratio, target 1.5x (wall / CPU) | "
        "rlhfkit runs compl/s | TRL runs compl/s | "
        "rlhfkit peak MiB | TRL peak MiB | memory ratio (<= 1x) | rlhfkit loop MiB | TRL loop MiB | "
        "rlhfkit lengths | TRL lengths | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        k, t = row.get("rlhfkit", {}), row.get("trl", {})
        speed = (
            "-"
            if "speed_ratio" not in row
            else f"{row['speed_ratio']:.2f}x / {row['cpu_ratio']:.2f}x "
            f"{'met' if row['speed_ok'] else 'NOT MET'}"
        )
        mem = (
            "-"
            if "memory_ratio" not in row
            else f"{row['memory_ratio']:.2f}x {'met' if row['memory_ok'] else 'NOT MET'}"
        )
        out.append(
            f"| {row['mode']} | {row['model']} | {row['workload']} | {_f(k.get('completions_per_second'))} "
            f"| {_f(t.get('completions_per_second'))} | {speed} | {_runs(k)} | {_runs(t)} | "
            f"{_f(k.get('peak_rss_mb'), '.0f')} | {_f(t.get('peak_rss_mb'), '.0f')} | {mem} | "
            f"{_f(k.get('loop_rss_mb'), '.0f')} | {_f(t.get('loop_rss_mb'), '.0f')} | {_lengths(k)} | "
            f"{_lengths(t)} | {k.get('runs', 0)}+{t.get('runs', 0)} |"
        )
    failed = [r for r in data["runs"] if "error" in r]
    for r in failed:
        out.append(
            f"\nFAILED: {r['library']} {r['mode']} {r['model']} {r['workload']}: "
            f"{r['error']} (log {r['log']})"
        )
    speed = [r for r in rows if "speed_ok" in r]
    met = sum(r["speed_ok"] for r in speed)
    mem_met = sum(r["memory_ok"] for r in speed)
    out += [
        "",
        f"**Speed target met in {met} of {len(speed)} settings; memory target met in {mem_met} of "
        f"{len(speed)}.** Loop MiB = peak RSS minus the import-only baseline (workloads/import_baseline.py).",
        "",
    ]
    out += ["What these figures mean, and why a target is missed: FINDINGS.md, section GRPO.", ""]
    return "\n".join(out)


def write(output_dir: Path, data: dict, final: bool = False) -> None:
    loads = [r["load_average_before"] for r in data["runs"] if "load_average_before" in r]
    data["info"].update(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        complete=final,
        load=f"{min(loads):.1f} to {max(loads):.1f}" if loads else "n/a",
    )
    data["summary"] = summarize(data)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "grpo_results.json").write_text(json.dumps(data, indent=1) + "\n")
    (output_dir / "GRPO_RESULTS.md").write_text(markdown(data))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--workloads", default="grpo,grpo-kl")
    parser.add_argument("--modes", default="fixed,eos")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=20.0,
        help="stop a run whose resident memory passes this many GiB (run.py's watchdog)",
    )
    parser.add_argument(
        "--time-budget", type=float, default=None, help="minutes: start no new pair after this"
    )
    parser.add_argument("--work-dir", default=str(bench.DEFAULT_WORK))
    parser.add_argument("--output-dir", default=str(HERE))
    parser.add_argument(
        "--render", default=None, metavar="JSON", help="only rewrite GRPO_RESULTS.md from this JSON"
    )
    parser.add_argument(
        "--resume", default=None, metavar="JSON", help="add --repeats more repeats to this JSON's runs"
    )
    args = parser.parse_args(argv)
    for name, valid in (("models", STEPS), ("workloads", ("grpo", "grpo-kl")), ("modes", MODES)):
        values = [v for v in getattr(args, name).split(",") if v]
        bad = [v for v in values if v not in valid]
        if bad or not values:
            parser.error(f"--{name}: unknown {bad or 'empty list'}; expected some of {', '.join(valid)}")
        setattr(args, name, values)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    args.work_dir, args.output_dir = Path(args.work_dir).resolve(), Path(args.output_dir)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        data = json.loads(Path(args.render).read_text())
        (args.output_dir / "GRPO_RESULTS.md").write_text(markdown(data))
        return 0
    meta = args.work_dir / "data" / "meta.json"
    if not meta.is_file() or any(
        m not in json.loads(meta.read_text()).get("models", {}) for m in args.models
    ):
        import prepare

        prepare.prepare(args.work_dir, args.models, sd=False)
    args.libraries = list(bench.LIBRARIES)
    args.rlhfkit_python = rlhfkit_wrapper(args.work_dir)
    where = subprocess.run(
        [args.rlhfkit_python, "-c", "import rlhfkit; print(rlhfkit.__file__)"],
        capture_output=True,
        text=True,
        env=bench.child_env(1),
    ).stdout.strip()
    trl = bench.trl_versions(["trl-new"]).get("trl-new", "trl-new")
    info = {
        "machine": bench.machine(),
        "commit": bench.git_commit(),
        "command": "python benchmarks/grpo_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": bench.rlhfkit_versions(args.rlhfkit_python),
        "trl_version": trl,
        "rlhfkit_file": where,
        "threads": args.threads,
        "warmup": args.warmup,
        "steps": STEPS,
        "repeats": args.repeats,
    }
    baselines = bench.import_baselines(args, [bench.WORKLOADS[w] for w in args.workloads])
    data = {"info": info, "import_baselines": baselines, "runs": []}
    if args.resume:  # earlier repeats of the same command (the commit and command recorded are this call's)
        old = json.loads(Path(args.resume).read_text())
        data["runs"], info["resumed_from"] = (
            old["runs"],
            {k: old["info"][k] for k in ("commit", "command", "date")},
        )
    measure(args, data)
    write(args.output_dir, data, final=True)
    failed = [r for r in data["runs"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
