"""Peak memory and seconds of one response-logprob forward+backward at a 151,936-token vocabulary.

A tiny Llama (hidden 64, 2 layers, untied head) is built locally from a seeded config, so nothing downloads.
Two ways to score B completions of R tokens after a Q-token query, each in a fresh subprocess:

- straightforward: `rlhfkit.rollout.forward_response` (full (B, R+1, V) logits, then log-softmax);
- chunked: `rlhfkit.rollout.lm_head.chunked_response_outputs` (row-chunked projection from hidden states,
  backward recomputes the logits in small (rows, vocabulary) tiles).

Loss = -mean logprob over response tokens. Memory is the process's peak RSS (`ru_maxrss`) minus the RSS
after building model and batch, so it counts what the step itself adds; on `--device cuda` it is
`torch.cuda.max_memory_allocated` above the same point. Both variants report the loss and gradient norm,
which must agree. Run from the repository root:

    python benchmarks/large_vocab_logprobs.py --lengths 256 1024
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
from _common import git_commit, limit_threads  # noqa: E402

VOCAB, HIDDEN, LAYERS, BATCH, QUERY = 151_936, 64, 2, 16, 16
VARIANTS = ("straightforward", "chunked")
RESULT_PREFIX = "LOGPROB_RESULT "


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _worker(variant: str, length: int, device: str, threads: int) -> dict:
    limit_threads(threads)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.rollout import forward_response, position_ids_from_mask
    from rlhfkit.rollout.lm_head import chunked_response_outputs

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=QUERY + length + 1,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(device)
    query_ids = torch.randint(3, VOCAB, (BATCH, QUERY), device=device)
    query_mask = torch.ones(BATCH, QUERY, dtype=torch.long, device=device)
    responses = torch.randint(3, VOCAB, (BATCH, length), device=device)
    response_mask = torch.ones(BATCH, length, dtype=torch.bool, device=device)

    def logprobs():
        if variant == "straightforward":
            # return_logits keeps forward_response on its full-logits path at any size
            out = forward_response(model, query_ids, query_mask, responses, response_mask, return_logits=True)
            return out.logprobs
        input_ids = torch.cat([query_ids, responses], dim=1)
        attention_mask = torch.cat([query_mask, response_mask.long()], dim=1)
        position_ids = position_ids_from_mask(attention_mask)
        return chunked_response_outputs(model, input_ids, attention_mask, position_ids, responses)[0]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    base_rss = _rss_gb()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated() / 2**30
    start = time.perf_counter()
    loss = -(logprobs() * response_mask).sum() / response_mask.sum()
    loss.backward()
    sync()
    seconds = time.perf_counter() - start
    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    result = {
        "variant": variant, "response_length": length, "device": device, "seconds": round(seconds, 3),
        "peak_rss_gb": round(_rss_gb(), 3), "step_rss_gb": round(_rss_gb() - base_rss, 3),
        "loss": loss.item(), "grad_norm": grad_norm.item(),
    }  # fmt: skip
    if device == "cuda":
        result["step_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30 - base_cuda, 3)
    return result


def _estimated_straightforward_gb(length: int) -> float:
    """float32 logits plus their gradient and one float32 copy in the log-softmax: about 3 x B x (R+1) x V."""
    return 3 * BATCH * (length + 1) * VOCAB * 4 / 2**30


def worker_result(command: list[str], prefix: str, **identity) -> dict:
    """Run a worker subprocess; its `prefix`-marked JSON line, else `identity` plus the tail of its error
    output."""
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(prefix):
            return json.loads(line[len(prefix) :])
    return {**identity, "error": (proc.stderr or proc.stdout)[-2000:]}


def _run_variant(variant: str, length: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--worker", variant, "--lengths", str(length),
               "--device", args.device, "--threads", str(args.threads)]  # fmt: skip
    return worker_result(command, RESULT_PREFIX, variant=variant, response_length=length)


def _print_table(rows: list[dict]) -> None:
    print(f"{'R':>6} {'variant':>16} {'seconds':>9} {'step mem GB':>12} {'loss':>10} {'grad norm':>10}")
    for r in rows:
        if "skipped" in r or "error" in r:
            print(f"{r['response_length']:>6} {r['variant']:>16}  {r.get('skipped') or 'error (see JSON)'}")
            continue
        memory = r.get("step_cuda_gb", r["step_rss_gb"])
        print(f"{r['response_length']:>6} {r['variant']:>16} {r['seconds']:>9.2f} {memory:>12.2f} "
              f"{r['loss']:>10.5f} {r['grad_norm']:>10.5f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024], help="response lengths")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--max-gb", type=float, default=12.0, help="skip straightforward runs estimated above this"
    )
    parser.add_argument("--output", type=Path, default=HERE / "large_vocab_logprobs.json")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(_worker(args.worker, args.lengths[0], args.device, args.threads)))
        return
    rows = []
    for length in args.lengths:
        for variant in VARIANTS:
            estimate = _estimated_straightforward_gb(length)
            if variant == "straightforward" and args.device == "cpu" and estimate > args.max_gb:
                rows.append({"variant": variant, "response_length": length,
                             "skipped": f"estimated {estimate:.1f} GB of logits and gradients > --max-gb "
                                        f"{args.max_gb}"})  # fmt: skip
                continue
            rows.append(_run_variant(variant, length, args))
    _print_table(rows)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(__file__),
        "model": {"vocab_size": VOCAB, "hidden_size": HIDDEN, "layers": LAYERS, "tied": False},
        "batch": BATCH, "query_length": QUERY, "threads": args.threads, "results": rows,
    }  # fmt: skip
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
