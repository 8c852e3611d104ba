"""GRPO on the addition task from one SFT checkpoint, for benchmarks/grpo_learning.py (issue 17, learning
bullet).

    python trl_grpo_addition.py SPEC.json [--library trl|rlhfkit]

The same driver trains both libraries (only the GRPOConfig/GRPOTrainer classes differ; rlhfkit keeps TRL's
names), so data, reward, settings and checkpoint timing are identical. SPEC.json holds "model" (the SFT
folder), "train" (a jsonl of prompt/answer rows), "settings" (GRPOConfig keyword arguments shared by both),
"trl_settings" (TRL-only switches, all at what rlhfkit does), "save_every" and "output_dir". Every
`save_every` steps the weights go to output_dir/step-N; the clocks are paused while saving, so the
wall and CPU seconds in output_dir/timings.json count training only. Loading the model and data is not timed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def exact_match(prompts, completions, answer, **columns):
    """1.0 when the completion, whitespace collapsed, is exactly the answer (rlhfkit's exact_match_reward on
    digit-only answers, re-stated without rlhfkit so the TRL side does not import it)."""
    return [float(" ".join(c.split()) == " ".join(str(a).split())) for c, a in zip(completions, answer)]


def checkpoint_callback(spec: dict, tokenizer, record: list):
    """Saves the policy every spec["save_every"] steps with the clocks stopped; records (step, wall, cpu)."""
    from transformers import TrainerCallback

    out, every = Path(spec["output_dir"]), spec["save_every"]

    class Checkpoints(TrainerCallback):
        paused = 0.0
        paused_cpu = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every and state.global_step != args.max_steps:
                return
            wall, cpu = time.perf_counter(), time.process_time()
            elapsed = wall - self.wall0 - self.paused, cpu - self.cpu0 - self.paused_cpu
            record.append({"step": state.global_step, "wall_seconds": elapsed[0], "cpu_seconds": elapsed[1]})
            model.save_pretrained(out / f"step-{state.global_step}")
            tokenizer.save_pretrained(out / f"step-{state.global_step}")
            self.paused += time.perf_counter() - wall
            self.paused_cpu += time.process_time() - cpu

    return Checkpoints()


def train(spec: dict, config_cls, trainer_cls, extra: dict) -> list:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(spec["settings"]["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    dataset = load_dataset("json", data_files=spec["train"], split="train")
    scratch = Path(spec["output_dir"]) / "trainer"
    args = config_cls(output_dir=str(scratch), **spec["settings"], **extra)
    record: list = []
    trainer = trainer_cls(
        model=model,
        reward_funcs=exact_match,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[checkpoint_callback(spec, tokenizer, record)],
    )
    trainer.train()
    return record


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    library = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--library" else "trl"
    if library == "trl":
        from trl import GRPOConfig, GRPOTrainer

        extra = spec["trl_settings"]
    else:
        from rlhfkit import GRPOConfig, GRPOTrainer

        extra = {}
    record = train(spec, GRPOConfig, GRPOTrainer, extra)
    (Path(spec["output_dir"]) / "timings.json").write_text(json.dumps(record, indent=1))
