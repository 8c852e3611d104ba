"""Numerical parity of rlhfkit's GRPO-family losses with TRL 1.16's GRPOTrainer, on one fixed batch.

`python benchmarks/grpo_parity.py [--trl-python PATH]` (rlhfkit's venv) builds a fixed batch (random
log-probs with requires_grad, old and reference log-probs, advantages, a ragged mask, entropies), computes
each case's loss, gradient and logged statistics with `rlhfkit.core`, then runs this same file under the
TRL venv's python (`--trl-side`), which calls TRL's own `GRPOTrainer._compute_loss` unmodified,
bound to a stand-in object that holds just the attributes it reads (the model forward is replaced
by returning the fixed log-probs, the accelerator by a one-process identity). The batch crosses as
JSON. It prints the max |difference| of loss, gradient and statistics per case and writes
benchmarks/grpo_parity.json. Cases marked `expected_difference` differ on purpose (docs/grpo_losses.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "workloads"))
from _common import git_commit  # noqa: E402

TRL_PYTHON = (
    "benchmarks/.venvs/trl-new/bin/python"  # made by benchmarks/setup_trl.sh; relative to the checkout
)
TOLERANCE = 1e-6
N, T, MAX_COMPLETION_LENGTH = 6, 7, 8

# name -> settings; TRL spells gspo as loss_type="grpo" with importance_sampling_level="sequence"
CASES: dict[str, dict] = {
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dapo (clip-higher 0.28)": {"loss_type": "dapo", "epsilon_high": 0.28},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "gspo": {"loss_type": "gspo", "epsilon": 0.05},
    "cispo (cap 1.1)": {"loss_type": "cispo", "epsilon_high": 1.1},
    "cispo (cap 5.0)": {"loss_type": "cispo", "epsilon_high": 5.0},
    "grpo + delta 1.25": {"loss_type": "grpo", "delta": 1.25},
    "grpo + kl (plain k3)": {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": False},
    "dapo + kl (bias-corrected k3)": {"loss_type": "dapo", "beta": 0.04, "use_bias_correction_kl": True},
    "dapo + top_entropy_quantile 0.5": {"loss_type": "dapo", "top_entropy_quantile": 0.5},
    "grpo, 2 micro-batches": {"loss_type": "grpo", "micro_batches": 2},
    "bnpo, 2 micro-batches": {"loss_type": "bnpo", "micro_batches": 2},
    "dapo, 2 micro-batches": {"loss_type": "dapo", "micro_batches": 2, "beta": 0.04},
    "dr_grpo, 2 micro-batches": {"loss_type": "dr_grpo", "micro_batches": 2},
    "cispo, 2 micro-batches": {"loss_type": "cispo", "micro_batches": 2, "epsilon_high": 1.1},
    "gspo + kl (bias-corrected k3)": {
        "loss_type": "gspo",
        "epsilon": 0.05,
        "beta": 0.04,
        "use_bias_correction_kl": True,
        "expected_difference": "TRL weights the KL by the sequence ratio at sequence level; rlhfkit keeps "
        "the token ratio, the weight under which the gradient is the unbiased reverse-KL gradient",
    },
}


def make_batch() -> dict[str, list]:
    import torch

    gen = torch.Generator().manual_seed(0)
    logprobs = -2 * torch.rand(N, T, generator=gen)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {
        "logprobs": logprobs.tolist(),
        "old_logprobs": (logprobs + 0.4 * torch.randn(N, T, generator=gen)).tolist(),
        "ref_logprobs": (logprobs + 0.2 * torch.randn(N, T, generator=gen)).tolist(),
        "advantages": torch.randn(N, generator=gen).tolist(),
        "entropies": (3 * torch.rand(N, T, generator=gen)).tolist(),
        "mask": mask.tolist(),
    }


def _row_slices(case: dict) -> list[slice]:
    size = N // case.get("micro_batches", 1)
    return [slice(i, i + size) for i in range(0, N, size)]


def rlhfkit_side(batch: dict, case: dict) -> dict:
    import torch

    from rlhfkit.core import entropy_mask, per_token_kl, policy_loss

    t = {k: torch.tensor(v, dtype=torch.float64 if k != "mask" else torch.long) for k, v in batch.items()}
    logprobs = t["logprobs"].clone().requires_grad_(True)
    beta, quantile = case.get("beta", 0.0), case.get("top_entropy_quantile", 1.0)
    total, stats = 0.0, {}
    for rows in _row_slices(case):
        lp, old, mask = logprobs[rows], t["old_logprobs"][rows], t["mask"][rows]
        kl = None
        if beta:
            sampling = old if case.get("use_bias_correction_kl") else None
            kl = per_token_kl(lp, t["ref_logprobs"][rows], "k3", sampling_logprobs=sampling)
        out = policy_loss(
            case["loss_type"],
            lp,
            old,
            t["advantages"][rows],
            mask,
            epsilon_low=case.get("epsilon", 0.2),
            epsilon_high=case.get("epsilon_high"),
            delta=case.get("delta"),
            per_token_kl=kl,
            beta=beta,
            max_completion_length=MAX_COMPLETION_LENGTH,
            step_tokens=t["mask"].sum().item(),
            step_sequences=N,
            entropy_mask=entropy_mask(t["entropies"][rows], mask, quantile) if quantile < 1 else None,
        )
        total = total + out.loss
        stats = {
            "clip_low": out.clip_ratio_low.item(),
            "clip_high": out.clip_ratio_high.item(),
            "clip_region": out.clip_ratio_region.item(),
        }
        if kl is not None:
            stats["kl"] = out.kl_mean.item()
    total.backward()
    return {"loss": total.item(), "grad": logprobs.grad.tolist(), "stats": stats}


def trl_side(batch: dict, case: dict) -> dict:
    """TRL's `_compute_loss`, unmodified, on a stand-in trainer (runs under TRL's venv)."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    t = {k: torch.tensor(v, dtype=torch.float64 if k != "mask" else torch.long) for k, v in batch.items()}
    logprobs = t["logprobs"].clone().requires_grad_(True)
    identity = SimpleNamespace(
        num_processes=1,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        pad_across_processes=lambda x, dim=0, pad_index=0: x,
    )
    sequence = case["loss_type"] == "gspo"
    slices = _row_slices(case)
    trainer = SimpleNamespace(
        loss_type="grpo" if sequence else case["loss_type"],
        importance_sampling_level="sequence" if sequence else "token",
        epsilon_low=case.get("epsilon", 0.2),
        epsilon_high=case.get("epsilon_high") or case.get("epsilon", 0.2),
        beta=case.get("beta", 0.0),
        top_entropy_quantile=case.get("top_entropy_quantile", 1.0),
        max_completion_length=MAX_COMPLETION_LENGTH,
        current_gradient_accumulation_steps=len(slices),
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        accelerator=identity,
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list)},
        args=SimpleNamespace(
            delta=case.get("delta"),
            use_bias_correction_kl=case.get("use_bias_correction_kl", False),
            steps_per_generation=len(slices),
        ),
    )
    trainer.get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask.__get__(trainer)
    total = 0.0
    for rows in slices:
        width = t["mask"].shape[1]
        trainer._get_per_token_logps_and_entropies = lambda *a, rows=rows, **k: (
            logprobs[rows],
            t["entropies"][rows],
            None,
        )
        inputs = {
            "prompt_ids": torch.zeros(len(range(N)[rows]), 1, dtype=torch.long),
            "prompt_mask": torch.ones(len(range(N)[rows]), 1, dtype=torch.long),
            "completion_ids": torch.zeros(len(range(N)[rows]), width, dtype=torch.long),
            "completion_mask": t["mask"][rows],
            "advantages": t["advantages"][rows],
            "old_per_token_logps": t["old_logprobs"][rows],
            "ref_per_token_logps": t["ref_logprobs"][rows],
            "num_items_in_batch": t["mask"].sum().double(),
        }
        trainer._metrics["train"].clear()
        total = total + GRPOTrainer._compute_loss(trainer, None, inputs)
    total.backward()
    m = trainer._metrics["train"]
    stats = (
        {"clip_high": m["cispo_clip_ratio"][-1], "clip_low": 0.0, "clip_region": m["cispo_clip_ratio"][-1]}
        if case["loss_type"] == "cispo"
        else {
            "clip_low": m["clip_ratio/low_mean"][-1],
            "clip_high": m["clip_ratio/high_mean"][-1],
            "clip_region": m["clip_ratio/region_mean"][-1],
        }
    )
    if case.get("beta"):
        stats["kl"] = m["kl"][-1]
    return {"loss": total.item(), "grad": logprobs.grad.tolist(), "stats": stats}


def _max_abs_diff(a, b) -> float:
    if isinstance(a, list):
        return max((_max_abs_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


def compare(trl_python: str) -> tuple[dict, str]:
    batch = make_batch()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps({"batch": batch, "cases": CASES}))
        subprocess.run([str(ROOT / trl_python), __file__, "--trl-side", str(src), str(dst)], check=True)
        trl = json.loads(dst.read_text())
    results = {}
    for name, case in CASES.items():
        ours = rlhfkit_side(batch, case)
        theirs = trl[name]
        row = {
            "loss": ours["loss"],
            "trl_loss": theirs["loss"],
            "loss_diff": abs(ours["loss"] - theirs["loss"]),
            "grad_diff": _max_abs_diff(ours["grad"], theirs["grad"]),
            "stats_diff": {k: abs(v - theirs["stats"][k]) for k, v in ours["stats"].items()},
        }
        within = max(row["loss_diff"], row["grad_diff"], *row["stats_diff"].values()) <= TOLERANCE
        row["match"] = within
        if "expected_difference" in case:
            row["expected_difference"] = case["expected_difference"]
        results[name] = row
        print(
            f"{name:34s} loss {ours['loss']:+.6f} trl {theirs['loss']:+.6f}  |dloss| {row['loss_diff']:.1e}  "
            f"|dgrad| {row['grad_diff']:.1e}  stats {max(row['stats_diff'].values()):.1e}  "
            f"{'match' if within else 'differs (expected)' if 'expected_difference' in case else 'DIFFERS'}"
        )
    return results, trl["__trl_version__"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trl-side", nargs=2, metavar=("IN", "OUT"), help="internal: run TRL on a batch file"
    )
    parser.add_argument(
        "--trl-python", default=TRL_PYTHON, help="TRL 1.16's python (absolute or from the checkout)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "grpo_parity.json"))
    args = parser.parse_args()
    if args.trl_side:
        data = json.loads(Path(args.trl_side[0]).read_text())
        import trl

        out = {name: trl_side(data["batch"], case) for name, case in data["cases"].items()}
        out["__trl_version__"] = trl.__version__
        Path(args.trl_side[1]).write_text(json.dumps(out))
        return
    import torch

    results, trl_version = compare(args.trl_python)
    record = {
        "command": " ".join(["python", *sys.argv]),
        "git_commit": git_commit(__file__),
        "trl_version": trl_version,
        "dtype": "float64",
        "tolerance": TOLERANCE,
        "torch": torch.__version__,
        "batch": {"sequences": N, "width": T, "max_completion_length": MAX_COMPLETION_LENGTH, "seed": 0},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
