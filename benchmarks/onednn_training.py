"""The products of a training pass at Qwen2.5-0.5B's shape: torch's float32 (MKL) against oneDNN.

    python benchmarks/onednn_training.py --out benchmarks/onednn_training.json

For each of the model's large linear layers (MLP 4,864 x 896 and 896 x 4,864, attention 896 x 896) and a
1,024 x 896 tile of the chunked head, at 64 to 2,240 rows (1,024: 16 completions of 64 tokens): the forward
product X W^T, the input gradient dY W and the weight gradient dY^T X, each through `torch.matmul` and
through oneDNN as `core.onednn_products` calls it (`mkldnn_linear` and its two backward functions,
conversions of the rows included; the weight is read in place). Its crossovers come from these cells. Each
time (wall and CPU) is the best of 7, torch's and oneDNN's measured in turn twice.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import time
from pathlib import Path

import torch

SHAPES = [(4864, 896), (896, 4864), (896, 896), (1024, 896)]  # the last: a tile of the chunked head
ROWS = [64, 256, 1024, 2240]


def best(fn, repeats: int = 7) -> tuple[float, float]:
    """The least wall and the least CPU milliseconds of a call (CPU time suffers less from a busy machine)."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls) * 1e3, min(cpus) * 1e3


def products(w: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> dict:
    """name -> (torch's product, oneDNN's) of one layer's forward and backward."""
    aten = torch.ops.aten
    return {
        "forward": (lambda: x @ w.T, lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), w, None).to_dense()),
        "input_grad": (
            lambda: dy @ w,
            lambda: aten.mkldnn_linear_backward_input(list(x.shape), dy.to_mkldnn(), w).to_dense(),
        ),
        "weight_grad": (
            lambda: dy.T @ x,
            lambda: aten.mkldnn_linear_backward_weights(dy.to_mkldnn(), x.to_mkldnn(), w, False)[0],
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cells = []
    for (out_features, in_features), rows in itertools.product(SHAPES, args.rows):
        w, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
        for name, (plain, dnn) in products(w, x, torch.randn(rows, out_features)).items():
            torch.testing.assert_close(dnn(), plain(), rtol=1e-3, atol=1e-2)  # the same product
            turns = [(best(plain), best(dnn)) for _ in range(2)]  # alternating, against drift
            (torch_ms, torch_cpu), (onednn_ms, onednn_cpu) = [
                [min(turn[i][k] for turn in turns) for k in (0, 1)] for i in (0, 1)
            ]
            cell = dict(out_features=out_features, in_features=in_features, rows=rows, product=name,
                        torch_ms=torch_ms, onednn_ms=onednn_ms, speedup=torch_ms / onednn_ms,
                        torch_cpu_ms=torch_cpu, onednn_cpu_ms=onednn_cpu,
                        cpu_speedup=torch_cpu / onednn_cpu)  # fmt: skip
            cells.append(cell)
            print(f"{out_features:>5} x {in_features:<5} {rows:>5} rows {name:<11}: torch {torch_ms:6.1f} ms",
                  f"oneDNN {onednn_ms:6.1f} ms, {cell['speedup']:.2f}x; CPU time {cell['cpu_speedup']:.2f}x",
                  flush=True)  # fmt: skip
    if args.out:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout
        command = "python benchmarks/onednn_training.py --out " + str(args.out)
        if args.rows != ROWS:
            command += " --rows " + " ".join(map(str, args.rows))
        report = dict(commit=commit.strip(), command=command, threads=args.threads, torch=torch.__version__)
        args.out.write_text(json.dumps({**report, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
