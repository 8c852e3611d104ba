"""SFT, reward-model and DPO workloads: `transformers.Trainer` loops on both sides, batch 16, fixed lengths.

Data come from prepare.py: SFT rows run past 128 tokens and are truncated to 128; preference rows are a
32-token prompt with 32-token chosen / rejected answers (the reward model sees prompt + answer). Each
library's config names differ a little; `configure` maps one description onto both.
"dpo-lv" (issue 16's large-vocabulary setting) reads pairs of a 6-token prompt and two `--length`-token
answers from data/lv (prepare.py writes them for lengths 64 to 1,024).
"""

from __future__ import annotations

BATCH = 16
SFT_MAX_LENGTH = 128
PAIR_MAX_LENGTH = 128


def dataset(args, workload: str):
    from _common import data_dir, read_jsonl
    from datasets import Dataset

    if workload == "dpo-lv":
        path = data_dir(args) / f"preference-{args.length}.jsonl"
        if not path.is_file():
            raise SystemExit(f"--length {args.length}: no {path.name}; prepare.py writes LV_LENGTHS only")
        return Dataset.from_list(read_jsonl(path))
    if workload == "sft":
        return Dataset.from_list(read_jsonl(args.work_dir / "data" / "sft.jsonl"))
    rows = read_jsonl(args.work_dir / "data" / "preference.jsonl")
    if workload == "reward":  # implicit prompt: the prompt is part of both sequences
        rows = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in rows]
    return Dataset.from_list(rows)


def tokens_per_step(args, workload: str) -> int:
    from _common import meta

    info = meta(args)
    if workload == "dpo-lv":
        return 2 * BATCH * (info["lv_data"]["query_tokens"] + args.length)
    pair = info["pref_prompt_tokens"] + info["pref_completion_tokens"]
    return {"sft": BATCH * info["sft_max_length"], "reward": 2 * BATCH * pair, "dpo": 2 * BATCH * pair}[
        workload
    ]


def run(args, library: str, workload: str, make_trainer) -> None:
    """`make_trainer(common_kwargs, model_path, tokenizer, dataset, callbacks)` returns a ready Trainer."""
    import tempfile

    import torch
    from _common import StepClock, emit, model_dir, step_callback, trainer_args_common
    from transformers import AutoTokenizer

    torch.manual_seed(args.seed)
    path = model_dir(args, "reward" if workload == "reward" else "policy")
    tokenizer = AutoTokenizer.from_pretrained(path)
    common = trainer_args_common(
        tempfile.mkdtemp(prefix=f"bench-{library}-{workload}-"), args.warmup + args.steps, args.seed
    )
    common.update(per_device_train_batch_size=BATCH, gradient_accumulation_steps=1)
    if workload.startswith("dpo"):  # room for prompt, answer and eos: nothing is truncated
        common["max_length"] = PAIR_MAX_LENGTH if workload == "dpo" else args.length + 16
    clock = StepClock()
    trainer = make_trainer(common, path, tokenizer, dataset(args, workload), [step_callback(clock)])
    trainer.train()
    emit(
        args,
        library,
        workload,
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=BATCH,
        tokens_per_step=tokens_per_step(args, workload),
        response_length=args.length,
    )
