"""Benchmark rlhfkit against TRL on the same tiny offline models: the one command (GitHub issue 9).

    python benchmarks/run.py [--workloads ppo,rloo,...] [--models tiny,small] [--repeats 3] [--quick]
    python benchmarks/run.py --workloads ppo-lv,rloo-lv,dpo-lv --models v152k --lengths 256,1024 --name lv

Steps: create the TRL venvs (benchmarks/setup_trl.sh), write models and data into benchmarks/.work
(prepare.py), check that every venv computes identical logits (parity.py), measure this CPU's matmul
throughput (roofline.py), then run every (repeat, model, workload) for both libraries, alternating which
library goes first, each run in its own subprocess with 2 threads. Results: a JSON file with every run and
a markdown table of medians (benchmarks/RESULTS.md; --quick writes under benchmarks/.work/quick instead).
The large-vocabulary workloads (`*-lv`, issue 16) run on the v1k ... v152k models at `--lengths`; a child
whose resident memory passes `--max-rss-gb` (or that leaves the machine under 1 GiB available) is stopped and
recorded as out of memory at that size. benchmarks/scaling.py draws their curves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Before anything imports torch here (prepare.py and roofline.py run in-process): idle OpenMP workers sleep
# instead of spinning, which on a busy machine turns a 2-thread matmul ~80x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
import _common as workload_common  # noqa: E402

DEFAULT_WORK = HERE / ".work"
VENVS = HERE / ".venvs"
RESULT_PREFIX = "BENCH_RESULT "
LV_SIZES = ("v1k", "v8k", "v32k", "v152k", "v152k-eos")  # prepare.VOCAB_SIZES
MIN_AVAILABLE_GB = 1.0  # a child is stopped before the machine itself runs out of memory


@dataclass(frozen=True)
class Workload:
    name: str
    trl_venv: str  # which TRL venv runs the TRL side
    metric: str  # the metric the target is stated in
    target: float | None  # minimum rlhfkit/TRL ratio of `metric` (None: speed not targeted)
    what: str
    sizes: tuple[str, ...] = ("tiny", "small")  # model sizes it runs on
    length: int | None = None  # default completion length where the workload takes --lengths

    def script(self, library: str) -> Path:
        return HERE / "workloads" / f"{library}_{self.name.replace('-', '_')}.py"


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "ppo",
            "trl-0.11",
            "episodes_per_second",
            2.0,
            "classic PPO generate/step loop, 16 episodes/step, 48 new tokens, 4 epochs x minibatch 4",
        ),
        Workload(
            "rloo-old",
            "trl-0.11",
            "episodes_per_second",
            2.0,
            "TRL-0.11-style RLOO, k=4, 16 completions/update, 48 tokens, 4 epochs (4 optimizer steps)",
        ),
        Workload(
            "rloo",
            "trl-new",
            "episodes_per_second",
            1.5,
            "RLOO, k=4, 16 completions per optimizer step, 48 tokens, 1 optimizer step per update",
        ),
        Workload("sft", "trl-new", "episodes_per_second", 1.0, "SFT, batch 16 x 128 tokens"),
        Workload("reward", "trl-new", "episodes_per_second", 1.0, "reward model, batch 16 pairs x 64 tokens"),
        Workload(
            "dpo", "trl-new", "episodes_per_second", 1.0, "DPO, batch 16 pairs, 32 prompt + 32 answer tokens"
        ),
        Workload(
            "grpo",
            "trl-new",
            "episodes_per_second",
            1.5,
            "GRPO, 4 prompts x 4 generations = 16 completions per optimizer step, 48 tokens, beta=0 "
            "(benchmarks/grpo_bench.py runs it; results in GRPO_RESULTS.md)",
        ),
        Workload(
            "grpo-kl", "trl-new", "episodes_per_second", 1.5, "as grpo with beta=0.04 (a reference model)"
        ),
        Workload(
            "ddpo",
            "trl-0.11",
            "episodes_per_second",
            None,
            "DDPO, 8 images x 10 DDIM steps, tiny SD (one size: listed as tiny)",
            sizes=("tiny",),
        ),
        Workload(
            "ppo-lv",
            "trl-0.11",
            "episodes_per_second",
            1.3,
            "classic PPO at a large vocabulary: 16 episodes of 6-token queries, minibatch 4, 1 PPO epoch",
            sizes=LV_SIZES,
            length=256,
        ),
        Workload(
            "rloo-lv",
            "trl-new",
            "episodes_per_second",
            1.3,
            "RLOO at a large vocabulary: 4 prompts x k=4 of 6 tokens, temperature 1, one optimizer step",
            sizes=LV_SIZES,
            length=256,
        ),
        Workload(
            "dpo-lv",
            "trl-new",
            "episodes_per_second",
            1.3,
            "DPO at a large vocabulary: 16 pairs of a 6-token prompt and two answers of the given length",
            sizes=LV_SIZES,
            length=256,
        ),
    )
}
LIBRARIES = ("rlhfkit", "trl")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# rlhfkit's venv beside each TRL venv: the same optional packages (setup_trl.sh). Pillow alone, which
# transformers imports whenever it is installed, moves the import-only memory baseline by ~17 MiB.
RLHFKIT_VENV = {"trl-new": "rlhfkit", "trl-0.11": "rlhfkit-diffusion"}


def rlhfkit_python(args: argparse.Namespace, venv: str = "rlhfkit") -> str:
    """The clean benchmarks/.venvs/<venv> when it exists (see setup_trl.sh), else this interpreter."""
    if args.rlhfkit_python:
        return args.rlhfkit_python
    clean = VENVS / venv
    return str(clean / "bin" / "python") if (clean / ".installed").exists() else sys.executable


def venv_python(library: str, workload: Workload, args: argparse.Namespace) -> str:
    if library == "rlhfkit":
        return rlhfkit_python(args, RLHFKIT_VENV[workload.trl_venv])
    return str(VENVS / workload.trl_venv / "bin" / "python")


def child_env(threads: int, library: str | None = None) -> dict[str, str]:
    """The children's environment; the rlhfkit side imports this checkout's src, whichever checkout the
    rlhfkit venv was installed from, so the figures belong to the commit results.json names."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads),
            "OMP_WAIT_POLICY": "PASSIVE",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONHASHSEED": "0",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "DIFFUSERS_VERBOSITY": "error",
            "ACCELERATE_LOG_LEVEL": "error",
            "WANDB_DISABLED": "true",
            "DISABLE_MLFLOW_INTEGRATION": "TRUE",
        }
    )
    env.pop("PYTHONPATH", None)  # each venv sees only its own packages
    if library == "rlhfkit":
        env["PYTHONPATH"] = str(HERE.parent / "src")
    return env


def run_one(
    library: str,
    workload: Workload,
    model: str,
    args: argparse.Namespace,
    log_dir: Path,
    length: int | None = None,
) -> dict:
    """One subprocess; its peak RSS comes from the OS (wait4's ru_maxrss) as well as from the child itself."""
    cmd = [
        venv_python(library, workload, args),
        str(workload.script(library)),
        "--work-dir",
        str(args.work_dir),
        "--model",
        model,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
    ]
    if args.eos:
        cmd.append("--eos")
    if length is not None:
        cmd += ["--length", str(length)]
    load_before = os.getloadavg()[0]
    log_path = log_dir / f"{library}-{workload.name}-{model}-{length}-{int(time.time() * 1000)}.log"
    where = {"library": library, "workload": workload.name, "model": model, "length": length}
    start = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(args.threads, library),
            cwd=HERE / "workloads",
        )
        try:
            _, status, usage = _wait4(proc, args.timeout, args.max_rss_gb)
        except TimeoutError:
            proc.kill()
            proc.wait()
            return {**where, "error": "timeout", "log": _repo_relative(log_path)}
        except MemoryError as exc:
            proc.kill()
            proc.wait()
            log(f"  stopped: {exc}")
            return {
                **where,
                "error": "out of memory",
                "oom": str(exc),
                "log": _repo_relative(log_path),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg()[0],
            }
    wall = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    # progress bars may share the line: take what follows the marker
    lines = [ln[ln.index(RESULT_PREFIX) :] for ln in text.splitlines() if RESULT_PREFIX in ln]
    if os.waitstatus_to_exitcode(status) != 0 or not lines:
        tail = "\n".join(text.splitlines()[-15:])
        return {
            **where,
            "log": _repo_relative(log_path),
            "error": f"exit code {os.waitstatus_to_exitcode(status)}",
            "tail": tail,
        }
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result.update(
        {
            "os_peak_rss_mb": usage.ru_maxrss / 1024.0,  # KiB on Linux
            "process_cpu_seconds": usage.ru_utime + usage.ru_stime,
            "process_wall_seconds": wall,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0],
            "length": length,
            "log": _repo_relative(log_path),
        }
    )
    return result


def _wait4(proc: subprocess.Popen, timeout: float, max_rss_gb: float | None = None):
    """Wait for `proc`; MemoryError when its RSS passes `max_rss_gb` or the machine nears running out."""
    deadline = time.monotonic() + timeout
    peak = 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return pid, status, usage
        if time.monotonic() > deadline:
            raise TimeoutError
        if max_rss_gb:
            rss, available = _meminfo_gb(proc.pid)
            peak = max(peak, rss)
            if rss > max_rss_gb or available < MIN_AVAILABLE_GB:
                raise MemoryError(
                    f"resident memory reached {peak:.1f} GiB (limit {max_rss_gb:g} GiB, "
                    f"{available:.1f} GiB left available on the machine)"
                )
        time.sleep(0.05)


def _meminfo_gb(pid: int) -> tuple[float, float]:
    """(resident GiB of `pid`, GiB available on the machine), from /proc."""
    rss = available = float("inf")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 2**20
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        return 0.0, float("inf")  # the child is exiting: nothing to stop
    return (0.0 if rss == float("inf") else rss), available


# ---------------------------------------------------------------------------------------------- set-up
def setup(args: argparse.Namespace, workloads: list[Workload]) -> dict:
    venvs = sorted({w.trl_venv for w in workloads}) if "trl" in args.libraries else []
    ours = sorted({RLHFKIT_VENV[v] for v in venvs})  # the rlhfkit venvs beside them
    if venvs and not args.no_setup:
        wanted = venvs + ([] if args.rlhfkit_python else ours)
        log(f"TRL venvs: {', '.join(wanted)} (benchmarks/setup_trl.sh)")
        subprocess.run(["bash", str(HERE / "setup_trl.sh"), *wanted], check=True)
    log(f"models and data -> {args.work_dir} (prepare.py)")
    import prepare  # in-process: the orchestrator runs in rlhfkit's venv, which builds the models

    meta = prepare.prepare(args.work_dir, args.models, sd=any(w.name == "ddpo" for w in workloads))
    if venvs and not args.skip_parity:
        log("parity: the same logits in every venv (parity.py)")
        for old in (args.work_dir / "parity").glob("*.npz"):
            old.unlink()
        pythons = [(tag, rlhfkit_python(args, tag), "rlhfkit") for tag in ours]
        pythons += [(v, str(VENVS / v / "bin" / "python"), v) for v in venvs]
        for tag, python, library in pythons:
            subprocess.run(
                [python, str(HERE / "parity.py"), "dump", "--tag", tag, "--work-dir", str(args.work_dir)],
                check=True,
                env=child_env(args.threads, library),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        check = subprocess.run(
            [sys.executable, str(HERE / "parity.py"), "compare", "--work-dir", str(args.work_dir)],
            capture_output=True,
            text=True,
            env=child_env(args.threads),
        )
        print(check.stdout, end="")
        if check.returncode != 0:
            raise SystemExit(
                "parity check failed: the venvs do not compute the same logits; nothing was timed"
            )
        meta["parity"] = check.stdout.strip().splitlines()
    return meta


def roofline(args: argparse.Namespace, models: list[str]) -> dict:
    log("roofline: matmul throughput at the models' shapes (roofline.py)")
    import roofline as roof

    return roof.measure(args.work_dir, models, args.threads, args.quick)


TRAINER_CLASS = {
    "ppo": "PPOTrainer",
    "rloo-old": "RLOOTrainer",
    "rloo": "RLOOTrainer",
    "sft": "SFTTrainer",
    "reward": "RewardTrainer",
    "dpo": "DPOTrainer",
    "ddpo": "DDPOTrainer",
    "grpo": "GRPOTrainer",
    "grpo-kl": "GRPOTrainer",
    "ppo-lv": "PPOTrainer",
    "rloo-lv": "RLOOTrainer",
    "dpo-lv": "DPOTrainer",
}


def import_baselines(args: argparse.Namespace, workloads: list[Workload]) -> dict[str, float]:
    """Peak RSS of importing each side's trainer (workloads/import_baseline.py), keyed 'library/workload'."""
    log("import-only memory baselines (workloads/import_baseline.py)")
    cache: dict[tuple[str, str], float] = {}
    out = {}
    for workload in workloads:
        for library in args.libraries:
            python = venv_python(library, workload, args)
            key = (python, TRAINER_CLASS[workload.name])
            if key not in cache:
                proc = subprocess.run(
                    [python, "import_baseline.py", TRAINER_CLASS[workload.name], "--package", library],
                    capture_output=True,
                    text=True,
                    env=child_env(args.threads, library),
                    cwd=HERE / "workloads",
                )
                lines = [
                    ln[ln.index(RESULT_PREFIX) :] for ln in proc.stdout.splitlines() if RESULT_PREFIX in ln
                ]
                if proc.returncode != 0 or not lines:
                    log(f"  {library}/{workload.name}: import failed:\n{proc.stderr[-1500:]}")
                    continue
                cache[key] = json.loads(lines[-1][len(RESULT_PREFIX) :])["peak_rss_mb"]
            out[f"{library}/{workload.name}"] = cache[key]
    return out


# ---------------------------------------------------------------------------------------------- summary
def summarize(
    runs: list[dict], meta: dict, roof: dict, baselines: dict[str, float] | None = None
) -> list[dict]:
    """Median over repeats per (workload, model, library), with rlhfkit/TRL ratios and FLOP/s estimates."""
    from roofline import floor_seconds, model_flops_per_step

    rows = []
    keys = sorted(
        {(r["workload"], r["model"], r.get("length")) for r in runs},
        key=lambda k: (list(WORKLOADS).index(k[0]), k[1], k[2] or 0),
    )
    for workload_name, model, length in keys:
        row: dict = {"workload": workload_name, "model": model}
        if length is not None:
            row["length"] = length
        for library in LIBRARIES:
            mine = [
                r
                for r in runs
                if (r["workload"], r["model"], r.get("length"), r["library"])
                == (workload_name, model, length, library)
            ]
            ok = [r for r in mine if "error" not in r]
            errors = [r for r in mine if "error" in r]
            if errors:
                row[f"{library}_error"] = errors[-1]["error"]
            if not ok:
                continue
            med = {
                m: statistics.median(r[m] for r in ok)
                for m in (
                    "seconds_per_step",
                    "episodes_per_second",
                    "tokens_per_second",
                    "peak_rss_mb",
                    "os_peak_rss_mb",
                )
            }
            med["max_os_peak_rss_mb"] = max(r["os_peak_rss_mb"] for r in ok)
            cpu = [r["cpu_seconds_per_step"] for r in ok if r.get("cpu_seconds_per_step")]
            if cpu:
                med["cpu_seconds_per_step"] = statistics.median(cpu)
            med["runs"] = len(ok)
            with_phases = [r["phases"] for r in ok if r.get("phases")]
            if with_phases:
                med["phases"] = {
                    k: statistics.median(p.get(k, 0.0) for p in with_phases) for k in with_phases[0]
                }
            if baselines and f"{library}/{workload_name}" in baselines:
                med["import_rss_mb"] = baselines[f"{library}/{workload_name}"]
            med["cpu_seconds_per_run"] = statistics.median(r["process_cpu_seconds"] for r in ok)
            flops = model_flops_per_step(workload_name, model, meta)
            if flops:
                med["model_gflops_per_second"] = flops / med["seconds_per_step"] / 1e9
            row[library] = med
        floor = floor_seconds(workload_name, model, meta, roof)
        if floor:
            row["floor_seconds"] = floor
            if "trl" in row:  # no library can beat the floor: TRL's time over it bounds the reachable ratio
                row["max_speed_ratio"] = row["trl"]["seconds_per_step"] / floor
        if "rlhfkit" in row and "trl" in row:
            workload = WORKLOADS[workload_name]
            row["speed_ratio"] = row["rlhfkit"][workload.metric] / row["trl"][workload.metric]
            row["memory_ratio"] = row["rlhfkit"]["os_peak_rss_mb"] / row["trl"]["os_peak_rss_mb"]
            if "cpu_seconds_per_step" in row["rlhfkit"] and "cpu_seconds_per_step" in row["trl"]:
                row["cpu_ratio"] = row["trl"]["cpu_seconds_per_step"] / row["rlhfkit"]["cpu_seconds_per_step"]
            row["speed_target"] = workload.target
            row["speed_ok"] = None if workload.target is None else row["speed_ratio"] >= workload.target
            row["memory_ok"] = row["memory_ratio"] <= 1.0
            k_loop = row["rlhfkit"]["os_peak_rss_mb"] - row["rlhfkit"].get("import_rss_mb", float("nan"))
            t_loop = row["trl"]["os_peak_rss_mb"] - row["trl"].get("import_rss_mb", float("nan"))
            if k_loop == k_loop and t_loop == t_loop and t_loop > 0:  # both import baselines known
                row["loop_memory_ratio"] = k_loop / t_loop
        rows.append(row)
    return rows


def _label(row: dict) -> str:
    """The model column: the size, and the completion length where the workload takes one."""
    return row["model"] + (f" @{row['length']}" if row.get("length") is not None else "")


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict], info: dict, roof: dict) -> str:
    out = [
        "# rlhfkit vs TRL benchmark results",
        "",
        f"Measured {info['date']} on {info['machine']}, at commit {info.get('commit', 'unrecorded')}. "
        f"Command: `{info['command']}`"
        + ("" if info.get("complete", True) else " (INCOMPLETE: the run was still going or was interrupted)"),
        "",
        f"Versions: {info['versions']}. {info['threads']} threads per run (`OMP_WAIT_POLICY=PASSIVE`), "
        f"{info['steps']} timed steps after {info['warmup']} warm-up step(s), median of {info['repeats']} "
        "repeat(s), libraries alternating which runs first. Fixed-length generation on both sides"
        + (" (realistic eos stopping: --eos)." if info["eos"] else "."),
        f"Load average during the run: {info['load']}."
        + (f" Note: {info['note']}." if info.get("note") else ""),
        "",
        "Ratios are rlhfkit / TRL (speed: episodes per second, higher is better; memory: peak RSS from the "
        "OS, lower is better; CPU-time ratio: TRL's CPU seconds per step over rlhfkit's, a cross-check that "
        "a busy machine disturbs less). Targets: PPO and old RLOO >= 2x TRL 0.11.4; RLOO >= 1.5x newest "
        "TRL; SFT / reward / DPO >= 1x; memory <= 1x everywhere.",
        "",
        "| workload | model | TRL | rlhfkit s/step | TRL s/step | rlhfkit eps | TRL eps | rlhfkit tok/s | "
        "TRL tok/s | rlhfkit peak MiB | TRL peak MiB | speed ratio (target) | CPU-time ratio | "
        "memory ratio | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        k, t = row.get("rlhfkit", {}), row.get("trl", {})
        workload = WORKLOADS[row["workload"]]
        ratio = row.get("speed_ratio")
        target = row.get("speed_target")
        speed = (
            "-"
            if ratio is None
            else f"{ratio:.2f}x"
            + (f" ({target:g}x {'ok' if row['speed_ok'] else 'MISSED'})" if target else " (no target)")
        )
        mem = (
            "-"
            if row.get("memory_ratio") is None
            else f"{row['memory_ratio']:.2f}x {'ok' if row['memory_ok'] else 'MISSED'}"
        )
        trl_version = info["trl_versions"].get(workload.trl_venv, workload.trl_venv)
        out.append(
            f"| {row['workload']} | {_label(row)} | {trl_version} | {_fmt(k.get('seconds_per_step'))} | "
            f"{_fmt(t.get('seconds_per_step'))} | {_fmt(k.get('episodes_per_second'))} | "
            f"{_fmt(t.get('episodes_per_second'))} | {_fmt(k.get('tokens_per_second'), '.0f')} | "
            f"{_fmt(t.get('tokens_per_second'), '.0f')} | {_fmt(k.get('os_peak_rss_mb'), '.0f')} | "
            f"{_fmt(t.get('os_peak_rss_mb'), '.0f')} | {speed} | "
            f"{'-' if row.get('cpu_ratio') is None else format(row['cpu_ratio'], '.2f') + 'x'} | {mem} | "
            f"{k.get('runs', 0)}+{t.get('runs', 0)} |"
        )
        for library in LIBRARIES:
            if f"{library}_error" in row:
                out.append(
                    f"|  | | {library} failed: {row[f'{library}_error']} (see the JSON for the log) |"
                    + " |" * 12
                )
    out += [
        "",
        "## Memory: what the loop holds beyond the imports",
        "",
        "Import-only: peak RSS of a process that imports torch, transformers, datasets and the trainer "
        "class (workloads/import_baseline.py). The difference is what building the models and running the "
        "loop adds.",
        "",
        "| workload | model | rlhfkit peak | rlhfkit import-only | rlhfkit loop | TRL peak | TRL "
        "import-only | TRL loop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = []
        for library in LIBRARIES:
            d = row.get(library, {})
            peak, base = d.get("os_peak_rss_mb"), d.get("import_rss_mb")
            cells += [
                _fmt(peak, ".0f"),
                _fmt(base, ".0f"),
                _fmt(None if peak is None or base is None else peak - base, ".0f"),
            ]
        out.append(f"| {row['workload']} | {_label(row)} | " + " | ".join(cells) + " |")
    phase_rows = [r for r in rows if any("phases" in r.get(lib, {}) for lib in LIBRARIES)]
    if phase_rows:
        out += [
            "",
            "## Where a PPO step goes (median seconds per step)",
            "",
            "`generate` and `reward_model` are timed by the loop; the rest are the trainers' own "
            "`time/ppo/*` statistics (`forward_pass`: old and reference logprobs and values; "
            "`optimize_step`: the PPO epochs).",
            "",
            "| model | library | generate | reward_model | forward_pass | compute_rewards | "
            "compute_advantages | optimize_step | calc_stats | step total |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in phase_rows:
            for library in LIBRARIES:
                ph = row.get(library, {}).get("phases")
                if ph:
                    keys = (
                        "generate",
                        "reward_model",
                        "forward_pass",
                        "compute_rewards",
                        "compute_advantages",
                        "optimize_step",
                        "calc_stats",
                        "total",
                    )
                    out.append(
                        f"| {_label(row)} | {library} | "
                        + " | ".join(_fmt(ph.get(k), ".3f") for k in keys)
                        + " |"
                    )
    out += [
        "",
        "## Roofline",
        "",
        "Matmul throughput of this CPU at the models' shapes (GFLOP/s, measured by roofline.py) next to the "
        "model FLOP/s each training step achieves (estimated: 6 * params * tokens for training, "
        "2 * params * tokens for forward passes and generation; see roofline.py). The floor is the time a "
        "step would take if every model FLOP ran at the best measured matmul rate for its shape (decode "
        "rows at the decode rate): no implementation can beat it, so TRL's seconds per step over the floor "
        "is the largest speed ratio any library could reach on this machine.",
        "",
    ]
    for model, shapes in roof.get("matmul", {}).items():
        listing = ", ".join(f"{name} {g:.1f}" for name, g in shapes.items())
        out.append(f"- {model}: {listing}")
    above = [
        f"{r['workload']}/{r['model']}"
        for r in rows
        for lib in LIBRARIES
        if r.get(lib, {}).get("model_gflops_per_second", 0)
        > max(roof.get("matmul", {}).get(r["model"], {"-": 0}).values() or [0])
    ]
    if above:  # a step outran the measured matmul rate: the roofline was measured low, so no floor is a bound
        out += [
            "",
            f"**Warning:** {', '.join(sorted(set(above)))} achieved more model FLOP/s than the measured "
            "matmul rate, so the roofline was measured low in this run and the floors below are not bounds.",
        ]
    out += [
        "",
        "| workload | model | rlhfkit model GFLOP/s | TRL model GFLOP/s | best matmul GFLOP/s | "
        "floor s/step | rlhfkit s/step | TRL s/step | largest reachable ratio (target) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        best = max(roof.get("matmul", {}).get(row["model"], {"-": 0}).values() or [0])
        k, t = row.get("rlhfkit", {}), row.get("trl", {})
        target = row.get("speed_target")
        bound = _fmt(row.get("max_speed_ratio"), ".2f") + "x" if row.get("max_speed_ratio") else "-"
        bound += f" ({target}x)" if target else ""
        out.append(
            f"| {row['workload']} | {_label(row)} | {_fmt(k.get('model_gflops_per_second'), '.2f')} | "
            f"{_fmt(t.get('model_gflops_per_second'), '.2f')} | {best:.1f} | "
            f"{_fmt(row.get('floor_seconds'), '.3f')} | {_fmt(k.get('seconds_per_step'), '.3f')} | "
            f"{_fmt(t.get('seconds_per_step'), '.3f')} | {bound} |"
        )
    findings = HERE / "FINDINGS.md"
    if findings.is_file():  # hand-written analysis of the latest full run (profiles, missed targets)
        out += ["", findings.read_text().strip()]
    large_vocab = HERE / "large_vocab" / "TABLES.md"
    if info.get("include_large_vocab", True) and large_vocab.is_file():  # written by scaling.py
        out += ["", large_vocab.read_text().strip()]
    out += ["", "## Workloads", ""]
    out += [
        f"- `{w.name}`: {w.what} (TRL side: {info['trl_versions'].get(w.trl_venv, w.trl_venv)})"
        for w in WORKLOADS.values()
    ]
    return "\n".join(out) + "\n"


def trl_versions(venvs: list[str]) -> dict[str, str]:
    versions = {}
    for venv in venvs:
        python = VENVS / venv / "bin" / "python"
        if python.exists():
            out = subprocess.run(
                [
                    str(python),
                    "-c",
                    "import trl, transformers; print(f'trl {trl.__version__} "
                    "(transformers {transformers.__version__})')",
                ],
                capture_output=True,
                text=True,
            )
            versions[venv] = out.stdout.strip() or venv
    return versions


def _repo_relative(path: Path) -> str:
    """`path` relative to the checkout when inside it, so result files name no machine's folders."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def git_commit() -> str:
    """The checkout's commit, `-dirty` when src/, the workloads or the harness (this file, prepare.py)
    differ."""
    return workload_common.git_commit(__file__, HERE / "prepare.py")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--models",
        default="tiny,small",
        help=f"comma list of tiny, small (and, for the *-lv workloads, {', '.join(LV_SIZES)})",
    )
    parser.add_argument(
        "--lengths",
        default=None,
        help="comma list of completion lengths for the *-lv workloads (default: 256)",
    )
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=20.0,
        help="stop a run whose resident memory passes this many GiB and record it as out of memory",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="results-NAME.json / RESULTS-NAME.md instead of results.json / RESULTS.md",
    )
    parser.add_argument("--libraries", default="rlhfkit,trl", help="comma list of rlhfkit, trl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 5; --quick 2)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos", action="store_true", help="realistic setting: generation stops at eos")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 1 repeat, 2 steps, output in .work/quick"
    )
    parser.add_argument("--no-setup", action="store_true", help="do not create/update the TRL venvs")
    parser.add_argument("--skip-parity", action="store_true")
    parser.add_argument(
        "--rlhfkit-python",
        default=None,
        help="interpreter for the rlhfkit side (default: benchmarks/.venvs/rlhfkit if present, else this "
        "one)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run before it is killed")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="minutes: after the first repeat, start no run that would end past this budget",
    )
    parser.add_argument("--output-dir", default=None, help="where results.json / RESULTS.md go")
    parser.add_argument("--work-dir", default=str(DEFAULT_WORK), help="models, data, parity dumps and logs")
    parser.add_argument(
        "--render",
        default=None,
        metavar="RESULTS_JSON",
        help="only rewrite RESULTS.md from this results.json (nothing runs)",
    )
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.models = [m for m in args.models.split(",") if m]
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x] if args.lengths else []
    except ValueError:
        parser.error(f"--lengths: expected a comma list of integers, got {args.lengths!r}")
    if any(n < 1 for n in args.lengths):
        parser.error(f"--lengths must be >= 1, got {args.lengths}")
    args.libraries = [x for x in args.libraries.split(",") if x]
    for name, values, valid in (
        ("--workloads", args.workloads, WORKLOADS),
        ("--models", args.models, ("tiny", "small") + LV_SIZES),
        ("--libraries", args.libraries, LIBRARIES),
    ):
        bad = [v for v in values if v not in valid]
        if bad or not values:
            parser.error(
                f"{name}: unknown {bad or 'empty list'}; expected a comma list of {', '.join(valid)}"
            )
    if args.quick:
        args.repeats = 1
        args.steps = args.steps or 2
    args.steps = args.steps or 5
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be >= 1, --warmup >= 0")
    args.work_dir = Path(args.work_dir).resolve()
    default_out = args.work_dir / "quick" if args.quick else HERE
    args.output_dir = Path(args.output_dir) if args.output_dir else default_out
    return args


def render(path: Path, output_dir: Path) -> None:
    """Rewrite RESULTS.md from a results.json (e.g. after editing FINDINGS.md), without running anything."""
    data = json.loads(path.read_text())
    rows = summarize(data["runs"], data["meta"], data["roofline"], data.get("import_baselines"))
    name = "RESULTS-eos.md" if data["info"].get("eos") else "RESULTS.md"
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / name).write_text(markdown(rows, data["info"], data["roofline"]))
    log(f"rendered {output_dir / name} from {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.render:
        render(Path(args.render), args.output_dir)
        return 0
    workloads = [WORKLOADS[w] for w in args.workloads]
    meta = setup(args, workloads)
    roof = roofline(args, [m for m in args.models if m in ("tiny", "small")])
    baselines = {} if args.quick else import_baselines(args, workloads)
    info = {
        "machine": machine(),
        "commit": git_commit(),
        "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": rlhfkit_versions(rlhfkit_python(args)),
        "trl_versions": trl_versions(
            sorted({w.trl_venv for w in workloads}) if "trl" in args.libraries else []
        ),
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "eos": args.eos,
        "include_large_vocab": not args.name,
        "max_rss_gb": args.max_rss_gb,
    }
    log_dir = args.work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs, loads = [], []
    started, last_duration = time.monotonic(), {}
    stopped_early = False
    for repeat in range(args.repeats):
        order = list(args.libraries) if repeat % 2 == 0 else list(reversed(args.libraries))
        for model, length, workload in _points(args, workloads):
            # both libraries of a pair run, or neither: a budget cut never leaves one side's repeat alone
            pair_cost = sum(last_duration.get((lib, workload.name, model, length), 0) for lib in order)
            if (
                args.time_budget
                and repeat > 0
                and time.monotonic() - started + pair_cost > 60 * args.time_budget
            ):
                stopped_early = True
                continue
            for library in order:
                if not workload.script(library).exists():
                    log(f"skip {library}/{workload.name}: no script {workload.script(library).name}")
                    continue
                key = (library, workload.name, model, length)
                log(
                    f"repeat {repeat + 1}/{args.repeats} {model} {workload.name} {library}"
                    + (f" length {length}" if length else "")
                    + " ..."
                )
                t0 = time.monotonic()
                result = run_one(library, workload, model, args, log_dir, length)
                last_duration[key] = time.monotonic() - t0
                result["repeat"] = repeat
                loads.append(os.getloadavg()[0])
                if "error" in result:
                    log(f"  FAILED ({result['error']}); log: {result['log']}\n{result.get('tail', '')}")
                else:
                    log(
                        f"  {result['seconds_per_step']:.3f} s/step, {result['episodes_per_second']:.2f} "
                        f"eps, peak {result['os_peak_rss_mb']:.0f} MiB (load "
                        f"{result['load_average_before']:.1f})"
                    )
                runs.append(result)
                write_outputs(args, info, meta, roof, baselines, runs, loads, final=False)
    if runs and not args.quick:  # the roofline is a best case: measure again now and keep the better rate
        import roofline as roof_module

        roof = roof_module.merge(roof, roofline(args, [m for m in args.models if m in ("tiny", "small")]))
    if stopped_early:
        log(f"--time-budget {args.time_budget} min reached: later repeats were cut short")
        info["note"] = (
            f"--time-budget {args.time_budget} min cut the last repeat(s) short; see the runs column"
        )
    write_outputs(args, info, meta, roof, baselines, runs, loads, final=True)
    failed = [r for r in runs if "error" in r]
    return 1 if failed else 0


def _points(args: argparse.Namespace, workloads: list[Workload]) -> list[tuple[str, int | None, Workload]]:
    """(model, completion length, workload) in run order; lengths only for workloads that take them."""
    points = []
    for model in args.models:
        for workload in workloads:
            if model not in workload.sizes:
                continue
            lengths = (args.lengths or [workload.length]) if workload.length is not None else [None]
            points += [(model, length, workload) for length in lengths]
    order = {(m, lv): n for n, (m, lv) in enumerate(dict.fromkeys((m, lv) for m, lv, _ in points))}
    return sorted(points, key=lambda p: order[(p[0], p[1])])  # all workloads of one (model, length) together


def rlhfkit_versions(python: str) -> str:
    code = (
        "import rlhfkit, torch, transformers; print(f'rlhfkit {rlhfkit.__version__} (transformers "
        "{transformers.__version__}), torch {torch.__version__}')"
    )
    out = subprocess.run(
        [python, "-c", code + "; print(rlhfkit.__file__)"],
        capture_output=True,
        text=True,
        env=child_env(1, "rlhfkit"),
    )
    lines = out.stdout.strip().splitlines()
    if len(lines) != 2:
        return f"rlhfkit import failed in {python}"
    return f"{lines[0]} from {_repo_relative(Path(lines[1]).parent)}"


def write_outputs(args, info, meta, roof, baselines, runs, loads, *, final: bool) -> None:
    """results.json and RESULTS.md; rewritten after every run, so an interrupted run keeps what it
    measured."""
    rows = summarize(runs, meta, roof, baselines)
    info = dict(
        info,
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load=f"{min(loads):.1f} to {max(loads):.1f}" if loads else "n/a",
        complete=final,
    )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = f"results-{args.name}" if args.name else "results-eos" if args.eos else "results"
    (args.output_dir / f"{stem}.json").write_text(
        json.dumps(
            {
                "info": info,
                "meta": meta,
                "roofline": roof,
                "import_baselines": baselines,
                "summary": rows,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    md_name = f"RESULTS-{args.name}.md" if args.name else "RESULTS-eos.md" if args.eos else "RESULTS.md"
    (args.output_dir / md_name).write_text(markdown(rows, info, roof))
    if final:
        log(f"wrote {args.output_dir / md_name} and {stem}.json")


if __name__ == "__main__":
    sys.exit(main())
