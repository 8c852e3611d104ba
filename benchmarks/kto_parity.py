"""Step-by-step parity of rlhfkit's KTOTrainer with TRL 1.16's, on the tiny Llama and small datasets.

`python benchmarks/kto_parity.py [--trl-python PATH]` (rlhfkit's venv) runs each case a few optimizer steps
with rlhfkit, then runs this same file under the TRL venv's python (`--side trl`), which trains TRL's own
`KTOTrainer` with the same model, data and settings (float32, no gradient checkpointing, sequential order).
Every logged metric both libraries share (loss, kl, rewards/*, logps/*, logits/*, num_tokens) is compared
step by step; the max |difference| per case is printed and written to benchmarks/kto_parity.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
TRL_PYTHON = "benchmarks/.venvs/trl-new/bin/python"  # made by benchmarks/setup_trl.sh
TOLERANCE = 1e-4
SHARED = ("loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
          "logps/rejected", "logits/chosen", "logits/rejected", "num_tokens")  # fmt: skip

# name -> (data, KTOConfig fields, LoRA rank or None)
CASES: dict[str, tuple[str, dict, int | None]] = {
    "kto, plain text": ("plain", {}, None),
    "apo_zero_unpaired": ("plain", {"loss_type": "apo_zero_unpaired"}, None),
    "kto, paired data unpaired": ("pairs", {}, None),
    "kto, conversational": ("chat", {}, None),
    "kto, 2 accumulation steps": ("plain", {"gradient_accumulation_steps": 2, "max_steps": 2}, None),
    "kto, desirable_weight 1.3": ("plain", {"desirable_weight": 1.3}, None),
    "kto, LoRA r=4": ("plain", {"learning_rate": 1e-2}, 4),
}


def _dataset(kind: str):
    import datasets

    if kind == "pairs":
        rows = [
            {"prompt": f"the film {i} is", "chosen": " very good", "rejected": " so bad"} for i in range(6)
        ]
    elif kind == "chat":
        rows = [
            {
                "prompt": [{"role": "user", "content": f"film {i}?"}],
                "completion": [{"role": "assistant", "content": "good" if i % 2 else "bad"}],
                "label": bool(i % 2),
            }
            for i in range(8)
        ]
    else:
        rows = [
            {"prompt": f"the movie {i} was ", "completion": "really good" if i % 3 else "quite bad",
             "label": bool(i % 3)}
            for i in range(8)
        ]  # fmt: skip
    return datasets.Dataset.from_list(rows)


def run_side(side: str, name: str, out: str) -> list[dict[str, float]]:
    """Train one case with `side`'s KTOTrainer; its step logs restricted to the shared metrics."""
    if side == "trl":
        from trl import KTOConfig, KTOTrainer
    else:
        from rlhfkit import KTOConfig, KTOTrainer
    from rlhfkit.testing import tiny_model, tiny_tokenizer

    data, fields, lora = CASES[name]
    settings = dict(
        output_dir=out, report_to="none", use_cpu=True, per_device_train_batch_size=4, bf16=False,
        gradient_checkpointing=False, max_length=64, beta=0.3, max_steps=3, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
    )  # fmt: skip
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=lora, lora_alpha=2 * lora, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        )
    trainer = KTOTrainer(
        model=tiny_model("llama"), args=KTOConfig(**{**settings, **fields}), train_dataset=_dataset(data),
        processing_class=tiny_tokenizer(), peft_config=peft_config,
    )  # fmt: skip
    trainer.train()
    return [
        {k: float(v) for k, v in h.items() if k in SHARED} for h in trainer.state.log_history if "loss" in h
    ]


def compare(trl_python: str, out: Path) -> dict[str, dict]:
    results = {}
    for name in CASES:
        ours = run_side("rlhfkit", name, str(out / "rlhfkit"))
        done = subprocess.run(
            [trl_python, __file__, "--side", "trl", "--case", name, "--out", str(out / "trl")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        keys = sorted({k for h in theirs for k in h} | {k for h in ours for k in h})
        # a metric logged by one library at a step and not by the other counts as an infinite difference
        diffs = [
            abs(a[k] - b[k]) if k in a and k in b else float("inf")
            for a, b in zip(ours, theirs)
            for k in set(a) | set(b)
        ]
        worst = max(diffs) if len(ours) == len(theirs) else float("inf")
        results[name] = {
            "steps": len(ours),
            "metrics": keys,
            "max_abs_diff": worst,
            "rlhfkit": ours,
            "trl": theirs,
        }
        print(f"{name:32s} steps={len(ours)} max|diff|={worst:.2e}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", default=TRL_PYTHON)
    parser.add_argument("--side", choices=["rlhfkit", "trl"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="/tmp/kto_parity")
    parser.add_argument("--result", default=str(ROOT / "benchmarks" / "kto_parity.json"))
    args = parser.parse_args()
    if args.side == "trl":
        print(json.dumps(run_side("trl", args.case, args.out)))
        return
    sys.path.insert(0, str(ROOT / "benchmarks" / "workloads"))
    import torch
    from _common import git_commit

    results = compare(args.trl_python, Path(args.out))
    trl_version = subprocess.run(
        [args.trl_python, "-c", "import trl; print(trl.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    record = {
        "command": " ".join(["python", *sys.argv]),
        "git_commit": git_commit(__file__),
        "trl_version": trl_version,
        "torch": torch.__version__,
        "tolerance": TOLERANCE,
        "all_within_tolerance": all(r["max_abs_diff"] <= TOLERANCE for r in results.values()),
        "results": results,
    }
    Path(args.result).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
