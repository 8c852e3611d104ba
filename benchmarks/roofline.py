"""The roofline line of the benchmark: what this CPU's matmuls reach, and what a training step asks of it.

`python roofline.py --work-dir .work` measures float32 `F.linear` throughput (GFLOP/s) with the harness's
thread count at the shapes the benchmark models run: a training batch (tokens x hidden -> intermediate,
hidden -> vocab) and a generation step (16 rows). `model_flops_per_step` estimates a workload's model
FLOPs per step with the usual rule: 2 * params * tokens for a forward pass or a generated token, 6 * params *
tokens for a forward + backward pass. Dividing by the measured seconds per step gives the model FLOP/s a
step achieves; the gap to the matmul line is the overhead (Python, small kernels, generation loops).
`floor_seconds` turns the same estimate into a lower bound on a step's time, hence an upper bound on the
speed ratio over TRL that any implementation could reach here.
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


def flops_breakdown(workload: str, model: str, meta: dict) -> dict[str, float] | None:
    """Model FLOPs one step of `workload` needs, split by matmul shape: `decode` (one token per row, 16
    rows) and `dense` (whole sequences: prefill, scoring forwards, training). None where no estimate is made.

    Only the work the algorithm needs is counted: PPO's old logprobs and values come with generation (a
    second policy pass is optional work, which rlhfkit skips and TRL 0.11 does), so they are not counted.
    """
    info = meta.get("models", {}).get(model)
    if not info:
        return None
    p, r = info["policy_params"], info["reward_params"]
    rl_tokens = RL_BATCH * (PROMPT_TOKENS + RESPONSE_TOKENS)
    decode = 2 * p * RL_BATCH * RESPONSE_TOKENS
    prefill = 2 * p * RL_BATCH * PROMPT_TOKENS
    if workload == "ppo":  # generate, reward forward, reference forward, 4 epochs of training
        return {
            "decode": decode,
            "dense": prefill + 2 * r * rl_tokens + 2 * p * rl_tokens + 4 * 6 * p * rl_tokens,
        }
    if workload in ("rloo-old", "rloo"):  # generate, reward + reference forward, epochs of training
        epochs = 4 if workload == "rloo-old" else 1
        return {
            "decode": decode,
            "dense": prefill + 2 * r * rl_tokens + 2 * p * rl_tokens + epochs * 6 * p * rl_tokens,
        }
    if workload == "sft":
        return {"decode": 0.0, "dense": 6 * p * 16 * SFT_TOKENS}
    if workload == "reward":  # chosen and rejected sequences through the reward model
        return {"decode": 0.0, "dense": 6 * r * 2 * 16 * PAIR_TOKENS}
    if workload == "dpo":  # policy forward + backward, reference forward, chosen + rejected
        return {"decode": 0.0, "dense": (6 + 2) * p * 2 * 16 * PAIR_TOKENS}
    return None


def model_flops_per_step(workload: str, model: str, meta: dict) -> float | None:
    """Estimated model FLOPs of one step of `workload` (None where no estimate is made, e.g. DDPO)."""
    parts = flops_breakdown(workload, model, meta)
    return None if parts is None else parts["decode"] + parts["dense"]


def floor_seconds(workload: str, model: str, meta: dict, roof: dict) -> float | None:
    """Seconds a step would take if every model FLOP ran at this CPU's measured matmul rate for its shape.

    No implementation can beat it (it ignores attention, norms, softmax, the optimizer and all overhead), so
    TRL's seconds per step divided by it bounds the speed ratio any library could reach on this machine.
    """
    parts = flops_breakdown(workload, model, meta)
    rates = roof.get("matmul", {}).get(model)
    if parts is None or not rates:
        return None
    dense_rate = max(g for name, g in rates.items() if name.startswith("train")) * 1e9
    decode_rate = max(g for name, g in rates.items() if name.startswith("decode")) * 1e9
    return parts["decode"] / decode_rate + parts["dense"] / dense_rate


def _gflops(rows: int, inner: int, outer: int, min_seconds: float, windows: int = 10) -> float:
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
    min_seconds = 0.1 if quick else 2.0
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


def merge(*measurements: dict) -> dict:
    """Per shape, the best rate of several measurements: the roofline is what the machine can do, and a
    measurement taken while another process held a core only says less (one full run measured half the rate
    of another an hour earlier). run.py measures before and after its runs."""
    merged = {"threads": measurements[0].get("threads"), "matmul": {}}
    for measurement in measurements:
        for model, shapes in measurement.get("matmul", {}).items():
            best = merged["matmul"].setdefault(model, {})
            for shape, rate in shapes.items():
                best[shape] = max(rate, best.get(shape, 0.0))
    return merged


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
