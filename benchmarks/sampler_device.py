"""The decode loop's samplers on a GPU: exactness of the two-level inverse CDF there, and its time against
`torch.multinomial` (which `rollout.decoding.sample_tokens` uses on any device but the CPU).

    python benchmarks/sampler_device.py --out benchmarks/sampler_device.json    # on a CUDA machine
    # on a copy of the checkout:
    python benchmarks/sampler_device.py --commit $(git rev-parse HEAD) --out $OUT/sampler_device.json

Exactness: 400k draws per case through `sample_inverse_cdf` on the GPU, checked with
tests/rollout/test_sampler_exactness.py's binned z-test (a 1% bias in any token's frequency is caught), for
flat, peaked and masked rows at 1,000 and 151,936 tokens, float32 and bfloat16-rounded probabilities.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "rollout"), str(ROOT / "benchmarks" / "workloads")]

from _common import git_commit  # noqa: E402
from test_sampler_exactness import assert_follows, row  # noqa: E402

from rlhfkit.rollout.decoding import sample_inverse_cdf, sample_tokens  # noqa: E402


def exactness(device: str) -> list[dict]:
    cases = []
    for vocab in (1000, 151_936):
        for kind in ("flat", "peaked", "masked"):
            for rounding in ("float32", "bfloat16"):
                probs = row(kind, vocab).to(device)
                probs = probs.bfloat16().float() if rounding == "bfloat16" else probs
                probs = probs / probs.sum()
                torch.manual_seed(0)
                draws = torch.cat([sample_inverse_cdf(probs.expand(20_000, -1)) for _ in range(20)])
                assert_follows(draws.cpu(), probs[0].cpu())  # raises on a bias
                cases.append(
                    {"vocab": vocab, "row": kind, "probabilities": rounding, "draws": 400_000, "ok": True}
                )
                print("exact:", cases[-1], flush=True)
    return cases


def timings(device: str, calls: int = 50) -> list[dict]:
    out = []
    for rows in (16, 64, 256):
        probs = torch.randn(rows, 151_936, device=device).softmax(-1)
        cell = {"rows": rows, "vocab": 151_936}
        samplers = {
            "inverse_cdf": sample_inverse_cdf,
            "multinomial": lambda p: torch.multinomial(p, 1),
            "sample_tokens": sample_tokens,
        }
        for name, draw in samplers.items():
            draw(probs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                draw(probs)
            torch.cuda.synchronize()
            cell[f"{name}_ms"] = round(1e3 * (time.perf_counter() - start) / calls, 4)
        print("time:", cell, flush=True)
        out.append(cell)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("sampler_device.json"))
    parser.add_argument("--commit", help="The commit measured, where the machine has no git (a copied tree).")
    args = parser.parse_args()
    report = {
        "command": " ".join(["python", *sys.argv]),
        "git_commit": args.commit or git_commit(__file__),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "exactness": exactness("cuda"),
        "timings": timings("cuda"),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
