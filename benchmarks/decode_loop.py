"""Generation only: transformers `generate` (HFGenerationBackend) against rlhfkit's decode loop.

Batch 16, 6-token prompts, sampling at temperature 1 with top-k and top-p off (the benchmarks'
setting), 48 and 256 new tokens, on three Llama models built locally: `llama` (tiny) and
`llama-small` from `rlhfkit.testing` (1,000-token vocabulary) and a 2-layer, 64-wide Llama with
Qwen2's 151,936-token vocabulary (benchmarks/prepare.py's `v152k` config). Two modes:
- fixed: every completion runs to the limit (`min_new_tokens`), the benchmarks' fixed-length setting;
- eos: the model's eos logit is raised (prepare.py's `_raise_eos`) so completions stop after about
  half the limit on average, geometrically spread, like real rollouts.
Each cell is the median of `--repeats` calls (one where a call takes over 5 s) after a short warm-up, the
two backends interleaved; wall and CPU (process) seconds are both reported since the machine may be shared.
Run from the repository root:

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_loop.py

(PASSIVE: on a shared machine, spinning OpenMP threads waiting for a busy core distort both timings.)

It first times the two samplers alone (one token per row from (16, 151,936) probabilities).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
from _common import git_commit  # noqa: E402

BATCH, PROMPT_TOKENS, SEED = 16, 6, 0


def _models():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlhfkit.testing import tiny_model

    config = LlamaConfig(
        vocab_size=151_936, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return {
        "tiny": tiny_model("llama"),
        "small": tiny_model("llama-small"),
        "v152k": LlamaForCausalLM(config),
    }


def _with_eos(model, mean_length: int):
    sys.path.insert(0, str(HERE))
    from prepare import _raise_eos

    eos_model = copy.deepcopy(model)
    _raise_eos(eos_model, mean_length)
    return eos_model


def _time(backend, ids, mask, params, seed: int):
    import torch

    torch.manual_seed(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    out = backend.generate(ids, mask, params)
    return time.perf_counter() - wall, time.process_time() - cpu, int(out.response_mask.sum())


def _cell(model, new_tokens: int, mode: str, repeats: int) -> dict:
    import torch

    from rlhfkit.rollout import SamplingParams, make_generation_backend

    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(2, 1000, (BATCH, PROMPT_TOKENS), generator=g)
    mask = torch.ones_like(ids)
    extra = {"min_new_tokens": new_tokens} if mode == "fixed" else {}
    params = SamplingParams(new_tokens, temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=(0,), extra=extra)
    engines = {name: make_generation_backend(model, 1, engine=name) for name in ("transformers", "rlhfkit")}
    for backend in engines.values():  # warm-up: a short call
        _time(backend, ids[:2], mask[:2], dataclasses.replace(params, max_new_tokens=4, extra={}), SEED)
    runs = {name: [_time(backend, ids, mask, params, SEED)] for name, backend in engines.items()}
    repeats = 1 if max(r[0][0] for r in runs.values()) > 5 else repeats  # slow cells: one timed call each
    for repeat in range(1, repeats):
        for name, backend in engines.items():
            runs[name].append(_time(backend, ids, mask, params, SEED + repeat))
    cell = {}
    for name, results in runs.items():
        wall, cpu = statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)
        tokens = statistics.median(r[2] for r in results)
        cell[name] = {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4), "tokens": tokens,
                      "tokens_per_s": round(tokens / wall, 1)}  # fmt: skip
    hf, ours = cell["transformers"], cell["rlhfkit"]
    cell["speedup_wall"] = round(hf["wall_s"] / ours["wall_s"], 2)
    cell["speedup_cpu"] = round(hf["cpu_s"] / ours["cpu_s"], 2)
    return cell


def _sampler_cell(vocab: int = 151_936, calls: int = 50) -> dict:
    """Seconds per draw of one token per row from (16, vocab) probabilities: multinomial against inverse
    CDF."""
    import torch

    from rlhfkit.rollout.decoding import sample_inverse_cdf

    probs = torch.randn(BATCH, vocab, generator=torch.Generator().manual_seed(SEED)).softmax(-1)
    samplers = {
        "multinomial": lambda: torch.multinomial(probs, 1),
        "inverse_cdf": lambda: sample_inverse_cdf(probs),
    }
    cell = {"vocab": vocab, "batch": BATCH}
    for name, draw in samplers.items():
        draw()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            draw()
        cell[name] = {"wall_ms": round(1e3 * (time.perf_counter() - wall) / calls, 3),
                      "cpu_ms": round(1e3 * (time.process_time() - cpu) / calls, 3)}  # fmt: skip
    cell["speedup_cpu"] = round(cell["multinomial"]["cpu_ms"] / cell["inverse_cdf"]["cpu_ms"], 2)
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "decode_loop.json")
    parser.add_argument(
        "--sampler_only", action="store_true", help="time only the samplers; add them to --out"
    )
    args = parser.parse_args()
    import torch

    sampler = _sampler_cell()
    print(f"sampler at V={sampler['vocab']}: multinomial {sampler['multinomial']['cpu_ms']} ms, inverse CDF "
          f"{sampler['inverse_cdf']['cpu_ms']} ms CPU per draw "
          f"({sampler['speedup_cpu']}x)", flush=True)  # fmt: skip
    if args.sampler_only:
        report = json.loads(args.out.read_text()) if args.out.exists() else {}
        report.update(sampler=sampler, sampler_command=" ".join([Path(sys.executable).name, *sys.argv]),
                      sampler_git_commit=git_commit(__file__))  # fmt: skip
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        return
    results = []
    for model_name, model in _models().items():
        model.eval()
        for new_tokens in (48, 256):
            for mode in ("fixed", "eos"):
                subject = model if mode == "fixed" else _with_eos(model, new_tokens // 2)
                cell = {"model": model_name, "new_tokens": new_tokens, "mode": mode,
                        **_cell(subject, new_tokens, mode, args.repeats)}  # fmt: skip
                results.append(cell)
                print(f"{model_name:6} {new_tokens:4} {mode:5}  transformers "
                      f"{cell['transformers']['tokens_per_s']:8.1f} tok/s  rlhfkit "
                      f"{cell['rlhfkit']['tokens_per_s']:8.1f} tok/s  speedup wall "
                      f"{cell['speedup_wall']:.2f}x cpu {cell['speedup_cpu']:.2f}x", flush=True)  # fmt: skip
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "git_commit": git_commit(__file__),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY") if k in os.environ},
        "threads": torch.get_num_threads(), "batch": BATCH, "prompt_tokens": PROMPT_TOKENS,
        "sampler": sampler, "results": results,
    }  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
