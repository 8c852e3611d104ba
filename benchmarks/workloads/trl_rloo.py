"""Newest TRL: the GRPO-style RLOOTrainer, 16 completions (4 prompts x 4) per optimizer step.

Matches rlhfkit_rloo.py: 48 new tokens at fixed length (min_new_tokens), temperature 0.7, KL coefficient
0.05 against a frozen reference, micro-batches of 4 accumulated into one optimizer step, one iteration.
"rloo-lv" (trl_rloo_lv.py): `--length` tokens at temperature 1, as rlhfkit's. With --eos, generation stops
at eos and the completion lengths are reported.
"""

from _common import workload_args

K, BATCH, MICRO, RESPONSE_LENGTH = 4, 16, 4, 48


def main(workload: str = "rloo") -> None:
    args = workload_args(__doc__)
    import tempfile

    import torch
    from _common import (
        StepClock,
        data_dir,
        emit,
        length_summary,
        model_dir,
        read_jsonl,
        record_lengths,
        step_callback,
        trainer_args_common,
    )
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl import RLOOConfig, RLOOTrainer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(args))
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir(args))
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir(args, "reward"))
    reward_tokenizer = AutoTokenizer.from_pretrained(model_dir(args, "reward"))
    rows = read_jsonl(data_dir(args) / "prompts.jsonl")
    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in rows]})
    steps = args.warmup + args.steps
    length = args.length or RESPONSE_LENGTH
    config = RLOOConfig(
        **trainer_args_common(tempfile.mkdtemp(prefix="bench-trl-rloo-"), steps, args.seed),
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=BATCH // MICRO,
        num_generations=K,
        max_completion_length=length,
        temperature=1.0 if workload == "rloo-lv" else 0.7,
        top_k=0,
        top_p=1.0,
        beta=0.05,
        num_iterations=1,
        generation_kwargs=None if args.eos else {"min_new_tokens": length},
    )
    clock = StepClock()
    trainer = RLOOTrainer(
        model=policy,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        reward_processing_classes=reward_tokenizer,
        callbacks=[step_callback(clock)],
    )
    # completion lengths of every generation round, warm-up ones dropped below
    lengths = record_lengths(trainer, "_generate_and_score_completions", lambda out: out["completion_mask"])
    trainer.train()
    timed = [n for step in lengths[args.warmup :] for n in step]
    emit(
        args,
        "trl",
        workload,
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=BATCH,
        tokens_per_step=sum(timed) / args.steps,
        response_length=length,
        optimizer_steps_per_step=1,
        lengths=length_summary(timed),
    )


if __name__ == "__main__":
    main()
