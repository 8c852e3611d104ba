"""Peak memory and seconds of one DPO and one SFT training step at a 151,936-token vocabulary.

The model is the tiny untied Llama of `large_vocab_logprobs.py` (hidden 64, 2 layers), built from a seeded
config, so nothing downloads. One step is `trainer.training_step(model, batch)`: forward, loss and backward
(for DPO with the reference pass), no optimizer update. Two variants, each in a fresh subprocess:

- full: the (B, T, V) logits path (what every DPO and SFT step did before the chunked path); forced by
  raising `rlhfkit.rollout.scoring.CHUNKED_HEAD_MIN_LOGITS` so no batch counts as large;
- chunked: the default, label tokens scored in tiles from the final hidden states (`rollout.lm_head`).

DPO: 4 pairs, a 32-token prompt, chosen responses of 480 tokens and rejected ones of 480, 440, 400, 360
(so the concatenated batch is 8 rows of 512 columns with some padding). SFT: 4 rows of 512, 480, 448, 416
tokens, every real token a label. Memory is the process's peak RSS (`ru_maxrss`) minus the peak after
building trainer and batch, so it counts what the step adds. Both variants report the loss, the gradient norm
and (DPO) the logged metrics, which must agree. Run from the repository root:

    nice python benchmarks/large_vocab_trainers.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from large_vocab_logprobs import HIDDEN, LAYERS, VOCAB, _rss_gb, git_commit, limit_threads, worker_result

HERE = Path(__file__).resolve().parent
BATCH, LENGTH, PROMPT = 4, 512, 32
TRAINERS, VARIANTS = ("dpo", "sft"), ("full", "chunked")
RESULT_PREFIX = "TRAINER_RESULT "


def _model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=LENGTH,
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _ids(g, n: int) -> list[int]:
    import torch

    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def _dpo(out: str):
    """(trainer, batch, step keywords) for one DPO step on 4 pairs of 512 columns at most."""
    import datasets
    import torch

    from rlhfkit.testing import tiny_tokenizer
    from rlhfkit.testing.training_args import few_step_args
    from rlhfkit.trainers.dpo.config import DPOConfig
    from rlhfkit.trainers.dpo.trainer import DPOTrainer

    args = few_step_args(DPOConfig, out, max_length=LENGTH, max_prompt_length=PROMPT)
    # the batch is built below
    text = datasets.Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}])
    trainer = DPOTrainer(model=_model(), args=args, train_dataset=text, processing_class=tiny_tokenizer())
    g = torch.Generator().manual_seed(1)
    rows = [
        {"prompt_input_ids": _ids(g, PROMPT), "chosen_input_ids": _ids(g, LENGTH - PROMPT),
         "rejected_input_ids": _ids(g, LENGTH - PROMPT - 40 * i)}
        for i in range(BATCH)
    ]  # fmt: skip
    return trainer, trainer.data_collator(rows), {}


def _sft(out: str):
    """(trainer, batch, step keywords) for one SFT step on 4 rows of 512 tokens at most."""
    import datasets
    import torch

    from rlhfkit.testing import tiny_tokenizer
    from rlhfkit.testing.training_args import few_step_args
    from rlhfkit.trainers.sft.config import SFTConfig
    from rlhfkit.trainers.sft.trainer import SFTTrainer

    args = few_step_args(SFTConfig, out, max_seq_length=LENGTH)
    text = datasets.Dataset.from_list([{"text": "a b c"}])  # the batch is built below
    trainer = SFTTrainer(model=_model(), args=args, train_dataset=text, processing_class=tiny_tokenizer())
    g = torch.Generator().manual_seed(1)
    batch = trainer.data_collator([{"input_ids": _ids(g, LENGTH - 32 * i)} for i in range(BATCH)])
    # what Trainer passes in training: the label tokens of the (here one-micro-batch) accumulated batch
    return trainer, batch, {"num_items_in_batch": batch["labels"][:, 1:].ne(-100).sum()}


def _worker(trainer_name: str, variant: str, threads: int) -> dict:
    limit_threads(threads)
    import torch

    from rlhfkit.rollout import scoring

    if variant == "full":
        # no batch counts as large: every pass builds the full logits
        scoring.CHUNKED_HEAD_MIN_LOGITS = 1 << 62
    with tempfile.TemporaryDirectory() as out:
        trainer, batch, kwargs = (_dpo if trainer_name == "dpo" else _sft)(out)
        model = trainer.model
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train's loop, not by __init__
        base_rss = _rss_gb()
        start = time.perf_counter()
        loss = trainer.training_step(model, batch, **kwargs)
        seconds = time.perf_counter() - start
    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    metrics = trainer._metrics.pop_means("train") if trainer_name == "dpo" else {}
    return {
        "trainer": trainer_name, "variant": variant, "seconds": round(seconds, 3),
        "peak_rss_gb": round(_rss_gb(), 3), "step_rss_gb": round(_rss_gb() - base_rss, 3),
        "loss": loss.item(), "grad_norm": grad_norm.item(), "metrics": metrics,
        "batch_shape": list(batch["chosen_input_ids" if trainer_name == "dpo" else "input_ids"].shape),
    }  # fmt: skip


def _run(trainer_name: str, variant: str, threads: int) -> dict:
    command = [sys.executable, __file__, "--worker", trainer_name, variant, "--threads", str(threads)]
    return worker_result(command, RESULT_PREFIX, trainer=trainer_name, variant=variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", default="", help="recorded in the JSON, e.g. how loaded the machine was")
    parser.add_argument("--output", type=Path, default=HERE / "large_vocab_trainers.json")
    parser.add_argument("--worker", nargs=2, metavar=("TRAINER", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(_worker(*args.worker, args.threads)))
        return
    rows = [_run(name, variant, args.threads) for name in args.trainers for variant in VARIANTS]
    print(f"{'trainer':>8} {'variant':>8} {'seconds':>9} {'step mem GB':>12} {'loss':>10} {'grad norm':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['trainer']:>8} {r['variant']:>8}  error (see JSON)")
            continue
        print(f"{r['trainer']:>8} {r['variant']:>8} {r['seconds']:>9.2f} {r['step_rss_gb']:>12.2f} "
              f"{r['loss']:>10.5f} {r['grad_norm']:>10.5f}")  # fmt: skip
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(__file__, HERE / "large_vocab_logprobs.py"),
        "model": {"vocab_size": VOCAB, "hidden_size": HIDDEN, "layers": LAYERS, "tied": False},
        "batch": BATCH, "max_length": LENGTH, "dpo_prompt_length": PROMPT, "threads": args.threads,
        "note": args.note, "results": rows,
    }  # fmt: skip
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
