"""How far the demo's figures move when only the arithmetic's last bits do: the tolerance of a records check
made on another CPU.

A demo run is deterministic on one machine, but another CPU can round a matrix product or a softmax
differently in its last bit; a sampled token flips now and then and the run takes another path. This
script gets such paths here by running the demo (afresh, same flags) under settings that change only how
the arithmetic is done: MKL's conditional-numerical-reproducibility modes and torch's portable kernels.
It writes `results/demo-<name>-spread.json`: each variant's figures and, per figure, the largest distance
from the plain run; `record_demo_result.py --check` allows twice that on a machine other than the record's.

    python scripts/measure_demo_spread.py --algo rloo            # the default demo
    python scripts/measure_demo_spread.py --task addition        # the verifiable task

Stdlib only, like record_demo_result.py, whose helpers it uses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import record_demo_result as records

# name -> environment: each computes the same maths with other roundings
VARIANTS: dict[str, dict[str, str]] = {
    "plain": {},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "mkl-avx2": {"MKL_CBWR": "AVX2"},
    "torch-default-kernels": {"ATEN_CPU_CAPABILITY": "default"},
}


def spread(runs: dict[str, dict[str, object]], base: str = "plain") -> dict[str, float]:
    """Per numeric figure, the largest distance of any variant from `base` (each element of a list)."""
    out: dict[str, float] = {}
    for key, value in runs[base].items():
        values = records.numbers_of(value)
        if values is None:
            continue
        distances = [0.0]
        for figures in runs.values():
            others = records.numbers_of(figures.get(key))
            distances += [abs(b - a) for a, b in zip(values, others or [])]
        out[key] = max(distances)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="rloo", choices=("rloo", "ppo", "ppo-multi-adapter", "dpo"))
    parser.add_argument("--task", default="sentiment")
    parser.add_argument(
        "--jobs", type=int, default=2, help="Demo runs at a time (each uses one torch thread)."
    )
    parser.add_argument("--results", default=str(records.ROOT / "results"))
    args, extra = parser.parse_known_args(argv)
    name = records.record_name(args.algo, args.task)
    flags = records.demo_command(args.algo, extra, args.task)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = dict(
            zip(VARIANTS, pool.map(lambda env: records.run_fresh(flags, env, quiet=True), VARIANTS.values()))
        )
    runs = {variant: records.figures(metrics) for variant, metrics in done.items()}
    report = {
        "command": " ".join(["python scripts/measure_demo_spread.py", *sys.argv[1:]]),
        "commit": records.git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": records.platform_fingerprint(),
        "demo_flags": flags,
        "variants": VARIANTS,
        "figures": runs,
        "spread": spread(runs),
    }
    out = Path(args.results) / f"demo-{name}-spread.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    for key, value in sorted(report["spread"].items()):
        if value:
            print(f"  {key}: {value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
