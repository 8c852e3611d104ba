"""Peak memory of a process that only imports a library's trainers: the floor under every workload's peak.

`python import_baseline.py CLASS [CLASS ...] --package rlhfkit|trl` imports torch, transformers, datasets
and the named trainer classes, then prints `BENCH_RESULT {"peak_rss_mb": ...}`. Subtracting it from a
workload's peak separates what the training loop holds from what merely importing the stack costs.
"""

import argparse
import importlib
import json

from _common import RESULT_PREFIX, limit_threads, peak_rss_mb

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("classes", nargs="+")
    parser.add_argument("--package", required=True)
    args = parser.parse_args()
    limit_threads(2)
    import datasets  # noqa: F401
    import transformers  # noqa: F401

    package = importlib.import_module(args.package)
    for name in args.classes:
        getattr(package, name)
    print(
        "\n" + RESULT_PREFIX + json.dumps({"package": args.package, "peak_rss_mb": peak_rss_mb()}), flush=True
    )
