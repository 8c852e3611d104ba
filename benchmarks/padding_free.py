"""Seconds of one rollout-scoring forward+backward, padded batch against packed rows (padding-free).

16 rows of a realistic spread: queries of 4..16 tokens (left-padded), completions of 8..256 tokens
(right-padded), drawn uniformly from a fixed seed. The model is `llama-small` from `rlhfkit.testing`
(about 10M parameters, built locally, nothing downloads). Each variant is `forward_response(...,
packed=False / True)` with loss = -mean logprob over response tokens, then backward; both report the
loss and gradient norm, which must agree. Timings are the median of `--repeats` runs after one warm-up,
the two variants interleaved.
Run from the repository root:

    python benchmarks/padding_free.py
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
from _common import git_commit  # noqa: E402

ROWS, QUERY_RANGE, RESPONSE_RANGE, SEED = 16, (4, 16), (8, 256), 0


def _batch(vocab_size: int, device: str):
    import torch

    g = torch.Generator().manual_seed(SEED)
    query_lengths = torch.randint(QUERY_RANGE[0], QUERY_RANGE[1] + 1, (ROWS,), generator=g)
    response_lengths = torch.randint(RESPONSE_RANGE[0], RESPONSE_RANGE[1] + 1, (ROWS,), generator=g)
    length_q, length_r = int(query_lengths.max()), int(response_lengths.max())
    query_ids = torch.randint(3, vocab_size, (ROWS, length_q), generator=g)
    responses = torch.randint(3, vocab_size, (ROWS, length_r), generator=g)
    query_mask = torch.arange(length_q).flip(0).unsqueeze(0) < query_lengths.unsqueeze(1)  # left padding
    response_mask = torch.arange(length_r).unsqueeze(0) < response_lengths.unsqueeze(1)  # right padding
    batch = (query_ids, query_mask.long(), responses, response_mask)
    return tuple(t.to(device) for t in batch)


def _step(model, batch, packed: bool, device: str):
    import torch

    from rlhfkit.rollout import forward_response

    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    out = forward_response(model, *batch, packed=packed)
    mask = batch[3]
    loss = -(out.logprobs * mask).sum() / mask.sum()
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    return seconds, loss.item(), grad_norm.item()


def _time_variants(model, batch, repeats: int, device: str) -> list[dict]:
    """Padded and packed steps interleaved (a shared machine's load drifts), after one warm-up each."""
    runs = {False: [], True: []}
    for repeat in range(repeats + 1):
        for packed in (False, True):
            result = _step(model, batch, packed, device)
            if repeat:
                runs[packed].append(result)
    return [
        {"variant": "packed" if packed else "padded",
         "median_seconds": round(statistics.median(r[0] for r in results), 4),
         "seconds": [round(r[0], 4) for r in results], "loss": results[-1][1], "grad_norm": results[-1][2]}
        for packed, results in runs.items()
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. how noisy the machine was)")
    parser.add_argument("--output", type=Path, default=HERE / "padding_free.json")
    args = parser.parse_args()

    import torch

    from rlhfkit.rollout import position_ids_from_mask
    from rlhfkit.rollout.packing import pack_rows
    from rlhfkit.testing import tiny_model

    torch.set_num_threads(args.threads)
    model = tiny_model("llama-small").to(args.device).train()
    batch = _batch(model.config.vocab_size, args.device)
    tokens = int(batch[1].sum() + batch[3].sum())
    padded_tokens = batch[0].numel() + batch[2].numel()
    attention_mask = torch.cat([batch[1], batch[3].long()], dim=1)
    packed_shape = pack_rows(
        torch.cat([batch[0], batch[2]], dim=1),
        attention_mask,
        position_ids_from_mask(attention_mask),
        batch[2].shape[1],
    ).input_ids.shape
    rows = _time_variants(model, batch, args.repeats, args.device)
    print(
        f"{ROWS} rows, {tokens} real tokens of {padded_tokens} padded ({1 - tokens / padded_tokens:.0%} "
        f"padding); packed into {packed_shape[0]} rows of {packed_shape[1]}"
    )
    print(f"{'variant':>8} {'median s':>9} {'speed-up':>9} {'loss':>10} {'grad norm':>10}")
    for r in rows:
        speedup = rows[0]["median_seconds"] / r["median_seconds"]
        print(
            f"{r['variant']:>8} {r['median_seconds']:>9.3f} {speedup:>8.2f}x {r['loss']:>10.5f} "
            f"{r['grad_norm']:>10.5f}"
        )
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(__file__),
        "model": "rlhfkit.testing llama-small", "device": args.device, "threads": args.threads,
        "rows": ROWS, "query_lengths": QUERY_RANGE, "response_lengths": RESPONSE_RANGE,
        "real_tokens": tokens, "padded_tokens": padded_tokens, "packed_shape": list(packed_shape),
        "repeats": args.repeats, "note": args.note,
        "results": rows,
    }  # fmt: skip
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
