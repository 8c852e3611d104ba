"""The products of a training pass at Qwen2.5-0.5B's shape: torch's float32 (MKL) against oneDNN.

    python benchmarks/onednn_training.py --out benchmarks/onednn_training.json

For each of the model's large linear layers (MLP 4,864 x 896 and 896 x 4,864, attention 896 x 896) at 1,120
rows (16 completions of ~70 tokens): the forward product X W^T, the input gradient dY W and the weight
gradient dY^T X, each through `torch.matmul` and through oneDNN (`mkldnn_linear` on converted operands,
conversions included). A measurement for a possible oneDNN training path; rlhfkit trains through torch's.
Each time is the best of 7.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

SHAPES = [(4864, 896), (896, 4864), (896, 896)]
ROWS = 1120


def best(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def onednn(a: torch.Tensor, b_rows: torch.Tensor) -> torch.Tensor:
    """a @ b_rows^T through oneDNN, operands converted inside the timing."""
    return torch._C._nn.mkldnn_linear(
        a.contiguous().to_mkldnn(), b_rows.contiguous().to_mkldnn(), None
    ).to_dense()


def products(w: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> dict:
    """name -> (torch's product, oneDNN's) of one layer's forward and backward."""
    return {
        "forward": (lambda: x @ w.T, lambda: onednn(x, w)),
        "input_grad": (lambda: dy @ w, lambda: onednn(dy, w.T)),
        "weight_grad": (lambda: dy.T @ x, lambda: onednn(dy.T, x.T)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cells = []
    for out_features, in_features in SHAPES:
        w, x = torch.randn(out_features, in_features), torch.randn(ROWS, in_features)
        for name, (plain, dnn) in products(w, x, torch.randn(ROWS, out_features)).items():
            torch.testing.assert_close(dnn(), plain(), rtol=1e-3, atol=1e-2)  # the same product
            cell = dict(out_features=out_features, in_features=in_features, rows=ROWS, product=name,
                        torch_ms=best(plain), onednn_ms=best(dnn))  # fmt: skip
            cell["speedup"] = cell["torch_ms"] / cell["onednn_ms"]
            cells.append(cell)
            print(f"{out_features:>5} x {in_features:<5} {name:<11}: torch {cell['torch_ms']:6.1f} ms, "
                  f"oneDNN {cell['onednn_ms']:6.1f} ms, {cell['speedup']:.2f}x")  # fmt: skip
    if args.out:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout
        command = "python benchmarks/onednn_training.py --out " + str(args.out)
        report = dict(commit=commit.strip(), command=command, threads=args.threads, torch=torch.__version__)
        args.out.write_text(json.dumps({**report, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
