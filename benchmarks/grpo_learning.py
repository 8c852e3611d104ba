"""GRPO learning efficiency, rlhfkit against TRL 1.16, on the addition task (issue 17, "Learning efficiency").

    python benchmarks/grpo_learning.py [--work-dir DIR] [--eval-every 25] [--eval-prompts 400]

1. The addition demo's SFT warm start, once, with rlhfkit (`rlhfkit demo --task addition` stages 1-2, seed 0):
   one SFT folder, and the train / held-out problems written as jsonl.
2. GRPO from that folder with the demo's GRPO settings, once per library, each in its own subprocess and one
   after the other, through the one driver workloads/trl_grpo_addition.py (rlhfkit under this checkout's src/,
   TRL under benchmarks/.venvs/trl-new); every `--eval-every` steps the weights are saved (clocks paused).
3. Every saved checkpoint of both runs is scored afterwards by the same function here: greedy held-out
   accuracy on a fixed subset of held-out problems. Writes grpo_learning.json and grpo_learning.png.

With `--use-vllm` (issue 34) the two runs are both rlhfkit's: `rlhfkit-vllm` samples on a vLLM server
(`rlhfkit vllm-serve` from .venv-vllm on the SFT folder, float32, eager; `use_vllm=True, vllm_mode="server"`,
weights pushed after every step, TRL's default sampler correction on) and `rlhfkit` on the decode loop, from
the same SFT folder with the same seed; grpo_learning_vllm[_seed<N>].json/.png say whether the curves agree.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
from _common import git_commit  # noqa: E402

LIBRARIES = ("rlhfkit", "trl")
VLLM_RUNS = ("rlhfkit", "rlhfkit-vllm")  # --use-vllm: the decode loop against a vLLM server
# TRL-only switches, each at what rlhfkit does (rlhfkit has none of these features)
TRL_SETTINGS = dict(
    use_vllm=False,
    use_liger_kernel=False,
    use_transformers_paged=False,
    disable_dropout=False,
    cast_lm_head_to_fp32=False,
    log_completions=False,
)


def grpo_settings(cfg) -> dict:
    """The demo's GRPO stage (demo/verifiable.py train_grpo) as GRPOConfig keyword arguments both libraries
    take."""
    return dict(
        per_device_train_batch_size=cfg.rl_batch_size, num_generations=cfg.num_generations,
        max_steps=cfg.rl_updates, num_iterations=cfg.rl_epochs, beta=cfg.kl_coef,
        max_completion_length=cfg.response_length, learning_rate=cfg.rl_learning_rate,
        lr_scheduler_type="constant", temperature=cfg.temperature, seed=cfg.seed, loss_type="dapo",
        scale_rewards="group", optim="adamw_torch",
        gradient_accumulation_steps=1, bf16=False, gradient_checkpointing=False, use_cpu=True,
        save_strategy="no", report_to="none", logging_strategy="no", disable_tqdm=True,
    )  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def rows(dataset) -> list[dict]:
    return [{"prompt": p, "answer": a} for p, a in zip(dataset["prompt"], dataset["answer"])]


def prepare(work: Path, eval_prompts: int):
    """The demo config, the SFT checkpoint (trained once, reused when present) and the jsonl datasets."""
    from rlhfkit.demo import stages
    from rlhfkit.demo.cache import StageResult
    from rlhfkit.demo.config import DemoConfig
    from rlhfkit.demo.verifiable import train_sft
    from rlhfkit.tasks import get_task

    cfg = DemoConfig(task="addition", output_dir=str(work), seed=0)
    task = get_task("addition")
    base, sft = work / "base", work / "sft-addition"
    info = {}
    if not (sft / "config.json").is_file():
        base.mkdir(parents=True, exist_ok=True)
        stages.build_base(cfg, base)
        sft.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        info = train_sft(cfg, task, StageResult("base", base, "", {}, 0.0), sft)
        info["seconds"] = time.perf_counter() - start
        (work / "sft_summary.json").write_text(json.dumps(info, indent=1))
    write_jsonl(work / "train.jsonl", rows(task.prompt_dataset("train", seed=cfg.seed)))
    write_jsonl(work / "heldout.jsonl", rows(task.prompt_dataset("test", n=eval_prompts, seed=cfg.seed)))
    return cfg, task


def train(library: str, work: Path, cfg, save_every: int, trl_python: str, seed: int, engine: dict) -> dict:
    """One GRPO run in a subprocess (torch on one thread); returns its checkpoint timings and process
    times. `library` "rlhfkit-vllm" is rlhfkit with the `engine` settings (use_vllm and the server's URL)."""
    out = work / f"grpo-{library}-seed{seed}"
    settings = {**grpo_settings(cfg), "seed": seed, **(engine if library == "rlhfkit-vllm" else {})}
    spec = {
        "model": str(work / "sft-addition"),
        "train": str(work / "train.jsonl"),
        "settings": settings,
        "trl_settings": TRL_SETTINGS,
        "save_every": save_every,
        "output_dir": str(out),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    python = trl_python if library == "trl" else sys.executable
    if library != "trl":
        env["PYTHONPATH"] = str(HERE.parent / "src")
    driver = HERE / "workloads" / "trl_grpo_addition.py"
    load_before = os.getloadavg()
    start = time.perf_counter()
    done = subprocess.run(
        [python, str(driver), str(out / "spec.json"), "--library", "trl" if library == "trl" else "rlhfkit"],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    (out / "log.txt").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"{library} GRPO run failed, see {out / 'log.txt'}:\n{done.stderr[-2000:]}")
    usage = os.times()  # children's CPU: cumulative, so the difference per run is taken by the caller
    return {
        "timings": json.loads((out / "timings.json").read_text()),
        "process_seconds": seconds,
        "children_cpu_after": usage.children_user + usage.children_system,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
    }


def greedy_accuracy(folder: Path, task, heldout: list[dict], response_length: int) -> tuple[int, int]:
    """Correct greedy answers of the policy in `folder` on the held-out rows: the one metric for both
    libraries."""
    from rlhfkit.demo import stages
    from rlhfkit.demo.sampling import sample_completions

    tokenizer = stages.load_tokenizer(folder)
    policy = stages.load_policy(folder)
    prompts, answers = [r["prompt"] for r in heldout], [r["answer"] for r in heldout]
    greedy = sample_completions(policy, tokenizer, prompts, response_length, 1.0, 0, 256, True)
    return int(sum(task.reward(greedy.texts, answer=answers))), len(prompts)


def point(step: int, wall: float, cpu: float, correct: int, n: int) -> dict:
    from rlhfkit.judges.win_rates import wilson_interval

    low, high = wilson_interval(correct / n, n)
    return {
        "step": step,
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "accuracy": correct / n,
        "ci95": [round(low, 4), round(high, 4)],
        "correct": correct,
        "n": n,
    }


def verdict(curves: dict) -> dict:
    """Met when rlhfkit's final held-out accuracy is at least TRL's and its training wall time is lower."""
    k, t = curves["rlhfkit"][-1], curves["trl"][-1]
    return {
        "rlhfkit_final_accuracy": k["accuracy"],
        "trl_final_accuracy": t["accuracy"],
        "accuracy_at_least_trl": k["accuracy"] >= t["accuracy"],
        "rlhfkit_wall_seconds": k["wall_seconds"],
        "trl_wall_seconds": t["wall_seconds"],
        "less_wall_time": k["wall_seconds"] < t["wall_seconds"],
        "wall_speedup": t["wall_seconds"] / k["wall_seconds"],
        "cpu_speedup": t["cpu_seconds"] / k["cpu_seconds"],
        "met": k["accuracy"] >= t["accuracy"] and k["wall_seconds"] < t["wall_seconds"],
    }


def vllm_verdict(curves: dict) -> dict:
    """The vLLM and decode-loop runs agree when each final accuracy lies in the other's 95% interval (one
    seed each: the interval stands in for seed noise; more seeds, `--seed`, tell more)."""
    v, k = curves["rlhfkit-vllm"][-1], curves["rlhfkit"][-1]
    return {
        "vllm_final_accuracy": v["accuracy"],
        "decode_loop_final_accuracy": k["accuracy"],
        "difference": v["accuracy"] - k["accuracy"],
        "within_intervals": k["ci95"][0] <= v["accuracy"] <= k["ci95"][1]
        and v["ci95"][0] <= k["accuracy"] <= v["ci95"][1],
        "vllm_wall_seconds": v["wall_seconds"],
        "decode_loop_wall_seconds": k["wall_seconds"],
        "wall_speedup": k["wall_seconds"] / v["wall_seconds"],
    }


@contextlib.contextmanager
def engine_settings(use_vllm: bool, work: Path, vllm_python: str):
    """The GRPOConfig fields of the vLLM run, while a server on the SFT folder runs (nothing without
    --use-vllm)."""
    if not use_vllm:
        yield {}
        return
    from rlhfkit.testing.vllm_server import vllm_server

    with vllm_server([vllm_python, "-m", "rlhfkit"], work / "sft-addition", work / "vllm-server.log") as url:
        yield {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": url}


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for library, style in zip(curves, ("o-", "s--")):
        pts = curves[library]
        for ax, key in zip(axes, ("step", "wall_seconds")):
            ax.errorbar(
                [p[key] for p in pts],
                [p["accuracy"] for p in pts],
                fmt=style,
                capsize=3,
                label=library,
                yerr=[
                    [p["accuracy"] - p["ci95"][0] for p in pts],
                    [p["ci95"][1] - p["accuracy"] for p in pts],
                ],
            )
    axes[0].set(xlabel="GRPO step", ylabel="held-out greedy accuracy")
    axes[1].set(xlabel="training wall seconds")
    axes[0].legend()
    fig.suptitle(
        "Addition task: GRPO from one SFT checkpoint, same settings (95% Wilson intervals)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="/tmp/grpo-learning")
    parser.add_argument("--output-dir", default=str(HERE))
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument(
        "--trl-python",
        default=str(HERE / ".venvs" / "trl-new" / "bin" / "python"),
        help="the TRL 1.16 venv's interpreter (benchmarks/setup_trl.sh builds it)",
    )
    parser.add_argument("--eval-prompts", type=int, default=400)
    parser.add_argument(
        "--use-vllm",
        action="store_true",
        help="rlhfkit on a vLLM server against rlhfkit's decode loop (no TRL)",
    )
    parser.add_argument("--vllm-python", default=str(HERE.parent / ".venv-vllm" / "bin" / "python"))
    parser.add_argument(
        "--max-steps", type=int, default=None, help="fewer GRPO steps than the demo's (a short run)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="GRPO seed (the SFT warm start is always the demo's, seed 0)"
    )
    args = parser.parse_args(argv)
    if args.eval_every < 1 or args.eval_prompts < 1:
        parser.error("--eval-every and --eval-prompts must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    # as the demo and the GRPO subprocesses: two threads on a shared 2-core machine stall
    torch.set_num_threads(1)
    work = Path(args.work_dir)
    cfg, task = prepare(work, args.eval_prompts)
    if args.max_steps is not None:
        cfg = dataclasses.replace(cfg, rl_updates=args.max_steps)
    heldout = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
    base_correct = greedy_accuracy(work / "sft-addition", task, heldout, cfg.response_length)
    runs, curves, cpu_before = {}, {}, 0.0
    # the other venv first (TRL's, vLLM's): a failure there shows early
    for library in reversed(VLLM_RUNS if args.use_vllm else LIBRARIES):
        cpu_before = os.times().children_user + os.times().children_system
        with engine_settings(library == "rlhfkit-vllm", work, args.vllm_python) as engine:
            runs[library] = train(library, work, cfg, args.eval_every, args.trl_python, args.seed, engine)
        runs[library]["process_cpu_seconds"] = runs[library].pop("children_cpu_after") - cpu_before
        curves[library] = [point(0, 0.0, 0.0, *base_correct)] + [
            point(
                t["step"],
                t["wall_seconds"],
                t["cpu_seconds"],
                *greedy_accuracy(
                    work / f"grpo-{library}-seed{args.seed}" / f"step-{t['step']}",
                    task,
                    heldout,
                    cfg.response_length,
                ),
            )
            for t in runs[library]["timings"]
        ]
    commit = git_commit(__file__)
    other = args.vllm_python if args.use_vllm else args.trl_python
    trl_version = subprocess.run(
        [
            other,
            "-c",
            "import vllm as v; print(v.__version__)"
            if args.use_vllm
            else "import trl; print(trl.__version__)",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    data = {
        "what": __doc__.splitlines()[0],
        "commit": commit,
        "command": "python benchmarks/grpo_learning.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores, torch 1 thread per run, runs one after the other (each run "
        "records the load average before and after it)",
        ("vllm_version" if args.use_vllm else "trl_version"): trl_version,
        "settings": {**grpo_settings(cfg), "seed": args.seed},
        **({} if args.use_vllm else {"trl_only_settings": TRL_SETTINGS}),
        "eval": {
            "heldout_problems": len(heldout),
            "every_steps": args.eval_every,
            "decoding": "greedy",
            "max_new_tokens": cfg.response_length,
        },
        "runs": runs,
        "curves": curves,
        "result": vllm_verdict(curves) if args.use_vllm else verdict(curves),
    }
    out = Path(args.output_dir)
    # seed 0 is the recorded run
    stem = "grpo_learning_vllm" if args.use_vllm else "grpo_learning"
    stem += "" if args.seed == 0 else f"_seed{args.seed}"
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(curves, out / f"{stem}.png")
    print(json.dumps(data["result"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
