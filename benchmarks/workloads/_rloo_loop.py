"""The TRL-0.11-style RLOO trainer, written once for both libraries (rlhfkit keeps that API).

16 completions per update (4 prompts x rloo_k=4), response length 48 at fixed length (no stop token; neither
side truncates), micro-batches of 4 accumulated into one optimizer step per mini-batch.
`epochs=4` is TRL 0.11's default (4 optimizer steps per update, the "rloo-old" workload); `epochs=1` is the
"rloo" workload compared with the newest TRL, which takes one optimizer step per 16 completions.
"rloo-lv" is "rloo" at `--length` tokens and temperature 1 (issue 16's large-vocabulary setting).
With --eos, completions stop at eos (`stop_token="eos"`) and their lengths are reported.
"""

from __future__ import annotations

K = 4
BATCH = 16
MICRO = 4
RESPONSE_LENGTH = 48


def run(args, library: str, workload: str, epochs: int, RLOOConfig, RLOOTrainer) -> None:  # noqa: N803
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

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(args))
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir(args))
    ref_policy = AutoModelForCausalLM.from_pretrained(model_dir(args))
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir(args, "reward"))
    rows = read_jsonl(data_dir(args) / "prompts.jsonl")
    dataset = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows]})
    steps = args.warmup + args.steps
    common = trainer_args_common(tempfile.mkdtemp(prefix=f"bench-{library}-rloo-"), steps, args.seed)
    common.pop("max_steps")
    length = args.length or RESPONSE_LENGTH
    config = RLOOConfig(
        **common,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=BATCH // MICRO,
        num_mini_batches=1,
        num_ppo_epochs=epochs,
        rloo_k=K,
        response_length=length,
        total_episodes=BATCH * steps,
        local_rollout_forward_batch_size=BATCH,
        num_sample_generations=0,
        stop_token="eos" if args.eos else None,
        temperature=1.0 if workload == "rloo-lv" else 0.7,
        kl_coef=0.05,
    )
    clock = StepClock()
    trainer = RLOOTrainer(
        config, tokenizer, policy, ref_policy, reward, dataset, callbacks=[step_callback(clock)]
    )
    # completion lengths of every rollout, warm-up ones dropped below
    lengths = record_lengths(trainer, "_rollout", lambda out: out[0].response_mask)
    trainer.train()
    timed = [n for step in lengths[args.warmup :] for n in step]
    emit(
        args,
        library,
        workload,
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=BATCH,
        tokens_per_step=sum(timed) / args.steps,
        response_length=length,
        optimizer_steps_per_step=epochs,
        lengths=length_summary(timed),
    )
