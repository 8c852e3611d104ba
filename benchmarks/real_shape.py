"""RL at the shape users train (issue 32): Qwen2.5-0.5B's architecture, rlhfkit against TRL, phase by phase.

    python benchmarks/prepare.py --sizes tiny,v152k-q05          # the model, built locally (~2 GB)
    python benchmarks/real_shape.py --algo grpo --pairs 2 --out benchmarks/real_shape/grpo-q05.json

The model is `v152k-q05` from prepare.py (24 layers, hidden 896, 14/2 heads, MLP 4,864, tied 151,936-token
embeddings, float32, seeded random weights). One optimizer step per step, on 16 completions of exactly 64
tokens (`min_new_tokens`) with a reference model and a rule reward, 2 threads:
- `grpo`: 4 prompts x 4 generations, beta 0.04, loss "dapo", one micro-batch of 16; against TRL 1.16;
- `ppo`: the classic `generate` / `step` loop, 16 prompts, one PPO epoch over one minibatch; against TRL
  0.11.4 (benchmarks/.venvs/trl-0.11);
- `rloo-current`: RLOOTrainer in TRL 1.x's form, the sizes of `grpo` (beta 0.04 inside the reward); against
  TRL 1.16;
- `rloo`: rlhfkit's RLOOTrainer in TRL 0.11's form, 4 prompts x rloo_k 4, one PPO epoch; rlhfkit only.
Each library runs in its own process (rlhfkit in this interpreter), one after the other, `--pairs` times,
alternating which goes first.

Per run: seconds and CPU seconds per step after the first; resident memory before the model, before
`train()` and at its peak (VmHWM); per phase (generation, reference pass, rlhfkit's policy forward, backward,
gradient clipping, optimizer; TRL's logprob passes cover its reference and policy forwards) the wall and CPU
seconds per step after the first and the largest resident size sampled every 20 ms in it; and
the state floor both libraries must hold: weights, gradients, two AdamW moments and the reference model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = "v152k-q05"
PROMPTS, GENERATIONS, LENGTH, BETA = 4, 4, 64, 0.04
RESULT = "REAL_SHAPE "


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


class Phases:
    """Wall and CPU seconds per phase, and the largest VmRSS seen in each (a 20 ms sampling thread)."""

    def __init__(self) -> None:
        import threading

        self.current, self.totals, self.peaks = "setup", {}, {}
        self.marks: list[dict] = []  # a copy of the totals at the start and after each step
        threading.Thread(target=self._sample, daemon=True).start()

    def mark(self) -> None:
        self.marks.append({k: list(v) for k, v in self.totals.items()})

    def per_step(self) -> dict:
        """Mean wall and CPU seconds of each phase over the steps after the first."""
        first, last, steps = self.marks[1], self.marks[-1], len(self.marks) - 2
        return {
            k: {"wall_s": round((v[0] - first.get(k, [0, 0])[0]) / steps, 2),
                "cpu_s": round((v[1] - first.get(k, [0, 0])[1]) / steps, 2)}
            for k, v in last.items()
        }  # fmt: skip

    def _sample(self) -> None:
        while True:
            name = self.current
            self.peaks[name] = max(self.peaks.get(name, 0.0), _status("VmRSS"))
            time.sleep(0.02)

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            outer, self.current = self.current, name
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                total = self.totals.setdefault(name, [0.0, 0.0])
                total[0] += time.perf_counter() - wall
                total[1] += time.process_time() - cpu
                self.current = outer

        setattr(owner, attribute, timed)


def _bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _state_floor_mib(model, separate_reference: bool = True, reference=None, optimizer=None) -> float:
    """Weights, plus gradients and two AdamW moments of the trainable ones, plus a reference copy of the
    weights when the trainer holds one (a LoRA policy's reference is its base: no copy). Given the
    `reference` module and the `optimizer`, their actual sizes replace the float32 copy and the two float32
    moments (a bfloat16 reference, an 8-bit optimizer)."""
    weights = _bytes(model)
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    moments = 2 * trained
    if optimizer is not None:
        state = getattr(optimizer, "optimizer", optimizer).state.values()
        moments = sum(t.numel() * t.element_size() for s in state for t in s.values() if hasattr(t, "numel"))
    held = _bytes(reference) if reference is not None else (weights if separate_reference else 0)
    return (weights + trained + moments + held) / 2**20


def _reward(completions, **columns):
    """A rule reward (no reward model at this shape): a tenth of the occurrences of "w1"."""
    return [c.count("w1") / 10 for c in completions]


def _prompts(work: Path) -> list[dict]:
    return [json.loads(line) for line in open(work / "data" / "lv" / "prompts.jsonl", encoding="utf-8")]


def _step_callback(marks: list, phases: Phases):
    from transformers import TrainerCallback

    class Tick(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            marks.append((time.perf_counter(), time.process_time()))
            phases.mark()

        on_step_end = on_train_begin

    return Tick()


# rlhfkit-only GRPO variants: the memory options users of this shape reach for (issue 32)
VARIANTS = {
    "none": {},
    "checkpointing": {"gradient_checkpointing": True},
    "bf16-reference": {"ref_model_dtype": "bfloat16"},  # the frozen reference copy in bfloat16
    "8bit-optimizer": {"optim": "adamw_bnb_8bit"},  # bitsandbytes' blockwise 8-bit AdamW (its CPU kernels)
    "lora": {},  # a LoRA policy (r 16 on every linear layer of the decoder): its base is the reference
}


def _grpo(library: str, work: Path, steps: int, phases: Phases, marks: list, variant: str = "none",
          algo: str = "grpo"):  # fmt: skip
    """GRPO, or with `algo="rloo-current"` RLOO in TRL 1.x's form (the same loop, RLOO's reward and loss)."""
    import importlib

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    name = "GRPO" if algo == "grpo" else "RLOO"
    if library == "rlhfkit":
        import rlhfkit.trainers.grpo.trainer as grpo

        phases.wrap(grpo.GRPOTrainer, "_reference_logprobs", "reference")
        phases.wrap(grpo, "forward_response", "policy forward")  # both trainers' training forward
    else:
        trainer_module = importlib.import_module(f"trl.trainer.{name.lower()}_trainer")
        phases.wrap(getattr(trainer_module, f"{name}Trainer"), "_get_per_token_logps_and_entropies",
                    "logprob passes")  # fmt: skip
    library_module = importlib.import_module(library)
    config_class = getattr(library_module, f"{name}Config")
    trainer_class = getattr(library_module, f"{name}Trainer")
    loss = {"loss_type": "dapo"} if algo == "grpo" else {}
    model = AutoModelForCausalLM.from_pretrained(_folder(work), dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in _prompts(work)]})
    config = config_class(
        output_dir=str(work / f"real-shape-{library}"), max_steps=steps, seed=0, report_to=[],
        save_strategy="no", logging_steps=10_000, disable_tqdm=True, use_cpu=True, learning_rate=1e-5,
        lr_scheduler_type="constant", bf16=False, fp16=False,
        per_device_train_batch_size=PROMPTS * GENERATIONS, gradient_accumulation_steps=1,
        num_generations=GENERATIONS, max_completion_length=LENGTH, temperature=1.0, top_p=1.0, top_k=0,
        beta=BETA, num_iterations=1, log_completions=False, **loss,
        generation_kwargs={"min_new_tokens": LENGTH},
        **{"gradient_checkpointing": False, **VARIANTS[variant]},
    )  # fmt: skip
    peft = None
    if variant == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM", target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # fmt: skip
    tick = _step_callback(marks, phases)
    trainer = trainer_class(model=model, reward_funcs=_reward, args=config, train_dataset=dataset,
                          processing_class=_tokenizer(work), callbacks=[tick],
                          **({"peft_config": peft} if peft else {}))  # fmt: skip

    def floor() -> float:
        reference = getattr(trainer, "ref_model", None)  # TRL's
        if library == "rlhfkit" and trainer.reference is not None:
            reference = trainer.reference.model
        return _state_floor_mib(trainer.model, peft is None, reference, trainer.optimizer)

    return floor, trainer.train


def _rloo(library: str, work: Path, steps: int, phases: Phases, marks: list, variant: str = "none"):
    """rlhfkit's RLOOTrainer in TRL 0.11's form (TRL 0.11's needs a reward model), with the same rule reward
    as GRPO: rlhfkit only. TRL 1.16's form is `rloo-current`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    import rlhfkit.trainers.rloo.trainer as rloo
    from rlhfkit import RLOOConfig, RLOOTrainer

    phases.wrap(rloo.ClassicRLOOTrainer, "_reference_logprobs", "reference")
    policy = AutoModelForCausalLM.from_pretrained(_folder(work), dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(_folder(work), dtype=torch.float32)
    dataset = Dataset.from_dict({"input_ids": [r["input_ids"] for r in _prompts(work)]})
    config = RLOOConfig(
        output_dir=str(work / "real-shape-rloo"), seed=0, report_to=[], save_strategy="no",
        logging_steps=10_000, disable_tqdm=True, use_cpu=True, learning_rate=1e-5,
        lr_scheduler_type="constant", per_device_train_batch_size=PROMPTS * GENERATIONS,
        gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=1, rloo_k=GENERATIONS,
        response_length=LENGTH, kl_coef=BETA,
        total_episodes=PROMPTS * GENERATIONS * steps, local_rollout_forward_batch_size=PROMPTS * GENERATIONS,
        num_sample_generations=0, temperature=1.0,
    )  # fmt: skip
    trainer = RLOOTrainer(config, _tokenizer(work), policy, reference, _reward, dataset,
                          callbacks=[_step_callback(marks, phases)])  # fmt: skip
    return (lambda: _state_floor_mib(policy)), trainer.train


def _ppo(library: str, work: Path, steps: int, phases: Phases, marks: list, variant: str = "none"):
    """The classic loop: `generate`, a rule score, `step` (one PPO epoch over one minibatch of 16, so one
    optimizer step per step as in GRPO); against TRL 0.11.4."""
    import torch

    if library == "rlhfkit":
        from rlhfkit import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    else:
        from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    phases.wrap(torch.optim.Adam, "step", "optimizer")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(str(_folder(work)))
    batch = PROMPTS * GENERATIONS
    config = PPOConfig(batch_size=batch, mini_batch_size=batch, gradient_accumulation_steps=1, ppo_epochs=1,
                       learning_rate=1e-5, seed=0, log_with=None)  # fmt: skip
    tokenizer = _tokenizer(work)
    trainer = PPOTrainer(config=config, model=model, ref_model=None, tokenizer=tokenizer)
    prompts = [torch.tensor(r["input_ids"]) for r in _prompts(work)]
    gen = dict(do_sample=True, top_k=0, top_p=1.0, max_new_tokens=LENGTH, min_new_tokens=LENGTH,
               pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip

    def train() -> None:
        marks.append((time.perf_counter(), time.process_time()))
        phases.mark()
        for step in range(steps):
            queries = prompts[step * batch : (step + 1) * batch]
            responses = trainer.generate(queries, batch_size=batch, return_prompt=False, **gen)
            texts = tokenizer.batch_decode(responses)
            trainer.step(queries, responses, [torch.tensor(score) for score in _reward(texts)])
            marks.append((time.perf_counter(), time.process_time()))
            phases.mark()

    return (lambda: _state_floor_mib(model)), train


def _rloo_current(library: str, work: Path, steps: int, phases: Phases, marks: list, variant: str = "none"):
    return _grpo(library, work, steps, phases, marks, variant, algo="rloo-current")


WORKLOADS = {"grpo": _grpo, "rloo-current": _rloo_current, "rloo": _rloo, "ppo": _ppo}
# the TRL each is compared with (none for the classic RLOO)
TRL_PYTHON = {"grpo": "trl-new", "rloo-current": "trl-new", "ppo": "trl-0.11"}


def _folder(work: Path) -> Path:
    return work / "models" / f"{MODEL}-policy"


def _tokenizer(work: Path):
    from transformers import PreTrainedTokenizerFast

    # AutoTokenizer would pick Qwen2's BPE class for this word-level tokenizer
    return PreTrainedTokenizerFast.from_pretrained(str(_folder(work)), padding_side="left")


def run_one(algo: str, library: str, work: Path, steps: int, threads: int, variant: str = "none") -> dict:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(threads)
    phases = Phases()
    if library == "rlhfkit":
        from rlhfkit.rollout.backends import GenerationBackend

        phases.wrap(GenerationBackend, "generate", "generate")
    else:
        from transformers.generation.utils import GenerationMixin

        phases.wrap(GenerationMixin, "generate", "generate")
    phases.wrap(torch.Tensor, "backward", "backward")
    phases.wrap(torch.optim.AdamW, "step", "optimizer")
    phases.wrap(torch.nn.utils, "clip_grad_norm_", "gradient clipping")
    rss_start = _status("VmRSS")
    marks: list[tuple[float, float]] = []
    floor_mib, train = WORKLOADS[algo](library, work, steps, phases, marks, variant)
    rss_before_train = _status("VmRSS")
    phases.current = "forward and the rest"
    train()
    gaps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])][1:]  # the first step warms up
    floor = floor_mib()
    peak = _status("VmHWM")
    return {
        "library": library,
        "version": __import__(library).__version__,
        "seconds_per_step": sum(w for w, _ in gaps) / len(gaps),
        "cpu_seconds_per_step": sum(c for _, c in gaps) / len(gaps),
        "rss_start_mib": rss_start,
        "rss_before_train_mib": rss_before_train,
        "peak_rss_mib": peak,
        "state_floor_mib": floor,
        "peak_over_floor": peak / floor - 1,
        "phases_per_step": phases.per_step(),  # steps after the first; the rest is the step minus these
        "phase_peak_rss_mib": {k: round(v) for k, v in phases.peaks.items()},
        "steps_timed": len(gaps),
    }


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True, cwd=HERE)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _child(library: str, python: str, args: argparse.Namespace) -> dict:
    command = [python, __file__, "--child", library, "--algo", args.algo, "--variant", args.variant,
               "--work-dir", str(args.work_dir), "--steps", str(args.steps),
               "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src") if library == "rlhfkit" else ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{library} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=list(WORKLOADS), default="grpo")
    parser.add_argument("--variant", choices=list(VARIANTS), default="none",
                        help="GRPO, rlhfkit only: a memory option (checkpointing, LoRA)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=HERE / ".work")
    parser.add_argument(
        "--steps", type=int, default=3, help="optimizer steps per run (the first is not timed)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1, help="rlhfkit/TRL pairs, alternating the order")
    parser.add_argument("--rlhfkit-only", action="store_true", help="no TRL run (no ratios): a quick check")
    parser.add_argument(
        "--trl-python", default=None, help="default: the venv of the TRL the workload is compared with"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    parser.add_argument("--child", choices=["rlhfkit", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is not timed")
    if args.child:
        result = run_one(args.algo, args.child, args.work_dir, args.steps, args.threads, args.variant)
        print(RESULT + json.dumps(result), flush=True)
        return
    if not (args.work_dir / "models" / f"{MODEL}-policy").is_dir():
        parser.error(f"no {MODEL} model under {args.work_dir}: run prepare.py --sizes tiny,{MODEL}")
    if args.variant != "none" and args.algo != "grpo":
        parser.error("--variant applies to --algo grpo only")
    if args.algo not in TRL_PYTHON or args.variant != "none":
        args.rlhfkit_only = True  # nothing to compare with
    venv = HERE / ".venvs" / TRL_PYTHON.get(args.algo, "trl-new") / "bin" / "python"
    pythons = {"rlhfkit": sys.executable, "trl": args.trl_python or str(venv)}
    runs = []
    for pair in range(args.pairs):
        order = ["rlhfkit", "trl"] if pair % 2 == 0 else ["trl", "rlhfkit"]
        order = ["rlhfkit"] if args.rlhfkit_only else order
        results = {library: _child(library, pythons[library], args) for library in order}
        for library in order:
            print(json.dumps({k: results[library][k] for k in ("library", "seconds_per_step",
                  "cpu_seconds_per_step", "peak_rss_mib", "peak_over_floor")}), flush=True)  # fmt: skip
        if args.rlhfkit_only:
            runs.append({"pair": pair, "order": order, **results})
            continue
        runs.append({
            "pair": pair, "order": order, **results,
            "speedup": results["trl"]["seconds_per_step"] / results["rlhfkit"]["seconds_per_step"],
            "cpu_speedup": results["trl"]["cpu_seconds_per_step"]
            / results["rlhfkit"]["cpu_seconds_per_step"],
            "peak_ratio": results["rlhfkit"]["peak_rss_mib"] / results["trl"]["peak_rss_mib"],
        })  # fmt: skip
    report = {
        "commit": _commit(),
        "command": "python benchmarks/real_shape.py " + " ".join(sys.argv[1:]),
        "load_average": os.getloadavg(),
        "workload": dict(
            algo=args.algo,
            variant=args.variant,
            model=MODEL,
            prompts=PROMPTS,
            generations=GENERATIONS,
            length=LENGTH,
            beta=BETA,
            micro_batch=PROMPTS * GENERATIONS,
            threads=args.threads,
        ),  # fmt: skip
        "runs": runs,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if not args.rlhfkit_only:
        print(json.dumps({k: [r[k] for r in runs] for k in ("speedup", "cpu_speedup", "peak_ratio")}))


if __name__ == "__main__":
    main()
