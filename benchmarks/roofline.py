"""The roofline line of the benchmark: what this CPU's matmuls reach, and what a training step asks of it.

`python roofline.py --work-dir .work` measures float32 `F.linear` throughput (GFLOP/s) with the harness's
thread count at the shapes the benchmark models run: a training batch (tokens x hidden -> intermediate,
hidden -> vocab) and a generation step (16 rows). `model_flops_per_step` estimates a workload's model
FLOPs per step with the usual rule: 2 * params * tokens for a forward pass or a generated token, 6 * params *
tokens for a forward + backward pass. Dividing by the measured seconds per step gives the model FLOP/s a
step achieves; the gap to the matmul line is the overhead (Python, small kernels, generation loops).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# Sizes the workload scripts use (kept here so the estimate and the scripts agree)
PROMPT_TOKENS = 16
RESPONSE_TOKENS = 48
RL_BATCH = 16
SFT_TOKENS = 128
PAIR_TOKENS = 64  # 32 prompt + 32 answer tokens per preference sequence


def model_flops_per_step(workload: str, model: str, meta: dict) -> float | None:
    """Estimated model FLOPs of one step of `workload` (None where no estimate is made, e.g. DDPO)."""
    info = meta.get("models", {}).get(model)
    if not info:
        return None
    p, r = info["policy_params"], info["reward_params"]
    rl_tokens = RL_BATCH * (PROMPT_TOKENS + RESPONSE_TOKENS)
    if workload == "ppo":  # generate, reward forward, policy + reference forward, 4 epochs of training
        return 2 * p * rl_tokens + 2 * r * rl_tokens + 2 * 2 * p * rl_tokens + 4 * 6 * p * rl_tokens
    if workload in ("rloo-old", "rloo"):  # generate, reward + reference forward, epochs of training
        epochs = 4 if workload == "rloo-old" else 1
        return 2 * p * rl_tokens + 2 * r * rl_tokens + 2 * p * rl_tokens + epochs * 6 * p * rl_tokens
    if workload == "sft":
        return 6 * p * 16 * SFT_TOKENS
    if workload == "reward":  # chosen and rejected sequences through the reward model
        return 6 * r * 2 * 16 * PAIR_TOKENS
    if workload == "dpo":  # policy forward + backward, reference forward, chosen + rejected
        return (6 + 2) * p * 2 * 16 * PAIR_TOKENS
    return None


def _gflops(rows: int, inner: int, outer: int, min_seconds: float, windows: int = 5) -> float:
    """Best of `windows` timing windows: the roofline is what the CPU can do, so a window in which another
    process took the core says nothing about it."""
    import torch
    import torch.nn.functional as F

    x, w = torch.randn(rows, inner), torch.randn(outer, inner)
    for _ in range(3):
        F.linear(x, w)
    best = 0.0
    for _ in range(windows):
        n, start = 0, time.perf_counter()
        while True:
            F.linear(x, w)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds / windows:
                break
        best = max(best, 2 * rows * inner * outer * n / elapsed / 1e9)
    return best


def measure(work: Path, models: list[str], threads: int, quick: bool) -> dict:
    import torch

    torch.set_num_threads(threads)
    meta = json.loads((work / "data" / "meta.json").read_text())
    min_seconds = 0.1 if quick else 0.5
    result = {"threads": threads, "matmul": {}}
    train_rows = RL_BATCH * (PROMPT_TOKENS + RESPONSE_TOKENS)
    for model in models:
        config = meta["models"][model]["config"]
        h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
        result["matmul"][model] = {
            f"train {train_rows}x{h}->{i}": _gflops(train_rows, h, i, min_seconds),
            f"train {train_rows}x{h}->{v}": _gflops(train_rows, h, v, min_seconds),
            f"decode {RL_BATCH}x{h}->{i}": _gflops(RL_BATCH, h, i, min_seconds),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=str(Path(__file__).parent / ".work"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(measure(Path(args.work_dir), args.models.split(","), args.threads, args.quick)))


if __name__ == "__main__":
    main()
