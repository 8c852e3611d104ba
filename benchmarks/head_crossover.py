"""Where the chunked output head stops paying: seconds of the bare head pass, full logits against chunked.

The trainers send a batch through the chunked head (`rlhfkit.core.chunked_logprobs`) only when its logits
would outgrow `rlhfkit.rollout.scoring.logits_exceed_one_chunk`'s threshold, and build the full logits
below it. This script times both ways on the same random hidden states, for a grid of vocabulary sizes,
hidden sizes and token counts, so that threshold can be set from figures:

- full: `hidden @ weight.T`, then `rlhfkit.core.logprobs.selective_log_softmax` (what the logits path runs
  after the model's head);
- chunked: `chunked_token_logprobs(hidden, weight, None, targets)`.

Two passes each: "train" (forward and backward of the summed logprobs, gradients for hidden and weight)
and "score" (forward under `torch.no_grad`, as the reference and rollout scoring run it). Each figure is the
median of `--repeats` timed runs after one warm-up; the full path is skipped where its logits alone would
pass `--max-full-gb`. Both paths' logprobs are compared (max abs difference reported). Run from the
repository root:

    python benchmarks/head_crossover.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
from _common import git_commit, limit_threads  # noqa: E402

VOCABS = (1_000, 8_192, 32_768, 151_936)
HIDDENS = (64, 896)
TOKENS = (16, 64, 256, 1_024, 4_096)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _case(vocab: int, hidden_size: int, tokens: int, repeats: int, max_full_gb: float) -> dict:
    import torch

    from rlhfkit.core.chunked_logprobs import chunked_token_logprobs
    from rlhfkit.core.logprobs import selective_log_softmax

    generator = torch.Generator().manual_seed(vocab + hidden_size + tokens)
    hidden = torch.randn(tokens, hidden_size, generator=generator).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=generator) / hidden_size**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator)

    def full():
        return selective_log_softmax(hidden @ weight.t(), targets)

    def chunked():
        return chunked_token_logprobs(hidden, weight, None, targets)

    def train(path):
        def step():
            hidden.grad = weight.grad = None
            path().sum().backward()

        return step

    def score(path):
        def step():
            with torch.no_grad():
                path()

        return step

    logits_mb = tokens * vocab * 4 / 2**20  # float32
    row = {"vocab": vocab, "hidden": hidden_size, "tokens": tokens, "full_logits_mb": round(logits_mb, 1)}
    for name, path in (("chunked", chunked), ("full", full)):
        if name == "full" and logits_mb / 1024 > max_full_gb:
            row["full_skipped"] = f"logits {logits_mb / 1024:.1f} GB > --max-full-gb {max_full_gb}"
            continue
        row[f"{name}_train_s"] = round(_time(train(path), repeats), 5)
        row[f"{name}_score_s"] = round(_time(score(path), repeats), 5)
    if "full_train_s" in row:
        with torch.no_grad():
            row["max_abs_diff"] = float((full() - chunked()).abs().max())
        row["train_chunked_over_full"] = round(row["chunked_train_s"] / row["full_train_s"], 3)
        row["score_chunked_over_full"] = round(row["chunked_score_s"] / row["full_score_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--hiddens", type=int, nargs="+", default=list(HIDDENS))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-full-gb", type=float, default=1.0)
    parser.add_argument("--output", type=Path, default=HERE / "head_crossover.json")
    args = parser.parse_args()
    commit = git_commit(__file__)  # before the run: the code that ran
    limit_threads(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print(
        f"{'V':>7} {'H':>4} {'tokens':>6} {'full MB':>8} {'train c/f':>10} {'score c/f':>10} "
        f"{'chunked train s':>16}"
    )
    for vocab in args.vocabs:
        for hidden_size in args.hiddens:
            for tokens in args.tokens:
                row = _case(vocab, hidden_size, tokens, args.repeats, args.max_full_gb)
                rows.append(row)
                print(f"{vocab:>7} {hidden_size:>4} {tokens:>6} {row['full_logits_mb']:>8} "
                      f"{row.get('train_chunked_over_full', '-'):>10} "
                      f"{row.get('score_chunked_over_full', '-'):>10} "
                      f"{row['chunked_train_s']:>16}", flush=True)  # fmt: skip
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": commit,
        "threads": args.threads, "repeats": args.repeats, "results": rows,
    }  # fmt: skip
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
