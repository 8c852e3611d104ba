"""One linear layer at decode-step sizes: torch's float32 product against oneDNN on a converted weight.

    OMP_NUM_THREADS=2 python benchmarks/packed_linear.py --out benchmarks/packed_linear.json

The shapes are Qwen2.5-0.5B's (MLP 4,864 x 896, attention 896 x 896 and 128 x 896, the 151,936 x 896 head)
and the large-vocabulary benchmark models' (151,936 x 64 head), plus the sizes around the thresholds of
`rlhfkit.rollout.packed_linear`; rows 1, 16 (a GRPO group batch) and 1,120 (a training pass of 16 x 70
tokens). Each time is the best of 7; `packed` is what `packed_linears` would choose for the layer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from rlhfkit.rollout.packed_linear import PACK_MIN_ELEMENTS, PACK_MIN_INPUTS

SHAPES = [(4864, 896), (896, 896), (128, 896), (151936, 896), (151936, 64), (32000, 64), (2048, 256),
          (1024, 512), (256, 64)]  # fmt: skip
ROWS = [1, 16, 1120]


def best(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cells = []
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features) * 0.02
        start = time.perf_counter()
        packed = weight.to_mkldnn()
        convert = time.perf_counter() - start
        chosen = out_features * in_features >= PACK_MIN_ELEMENTS and in_features >= PACK_MIN_INPUTS
        for rows in ROWS:
            if rows == 1120 and out_features * in_features > 2**24:
                continue  # the head at training size: minutes, and never sampled at that size
            x = torch.randn(rows, in_features)
            plain = best(lambda x=x, w=weight: torch.nn.functional.linear(x, w))
            onednn = best(lambda x=x, w=packed: torch._C._nn.mkldnn_linear(x.to_mkldnn(), w, None).to_dense())
            cell = dict(out_features=out_features, in_features=in_features, rows=rows, torch_ms=plain * 1e3,
                        onednn_ms=onednn * 1e3, speedup=plain / onednn, convert_ms=convert * 1e3,
                        packed=chosen)  # fmt: skip
            cells.append(cell)
            print(f"{out_features:>6} x {in_features:<4} rows {rows:>4}: torch {plain * 1e3:8.3f} ms, "
                  f"oneDNN {onednn * 1e3:8.3f} ms, {plain / onednn:.2f}x, packed={chosen}")  # fmt: skip
    if args.out:
        git = ["git", "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
        command = "python benchmarks/packed_linear.py --out " + str(args.out)
        report = dict(commit=commit, command=command, threads=args.threads, torch=torch.__version__)
        report["cells"] = cells
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
