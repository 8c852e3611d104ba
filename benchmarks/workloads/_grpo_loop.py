"""The GRPO workload, written once for both libraries (rlhfkit's GRPOConfig keeps TRL's names and defaults).

One optimizer step per 16 completions: 4 prompts x num_generations=4, micro-batches of 4 accumulated 4 times,
steps_per_generation = gradient_accumulation_steps and num_iterations=1, so neither side runs an extra
old-logprob forward pass (both reuse the detached current logprobs). At most 48 new tokens, temperature 1,
loss_type "dapo" (both defaults), float32, no gradient checkpointing. Fixed length forces 48 tokens with
`min_new_tokens`; `--eos` lets generation stop at the eos token. The reward is a rule (a Python function,
no reward model) that also records every completion's length, so both sides report the same distribution.
"""

from __future__ import annotations

NUM_GENERATIONS = 4
BATCH = 16  # completions per optimizer step
MICRO = 4
MAX_COMPLETION = 48
BETA = {"grpo": 0.0, "grpo-kl": 0.04}

LENGTHS: list[int] = []  # every scored completion's token count, in order


def count_e(prompts, completions, completion_ids=None, **columns):
    """Reward: a tenth of the occurrences of the letter "e" (varies within a group); records the lengths."""
    LENGTHS.extend(len(ids) for ids in completion_ids)
    return [c.count("e") / 10 for c in completions]


def run(args, library: str, workload: str, GRPOConfig, GRPOTrainer, **library_settings) -> None:  # noqa: N803
    import statistics
    import sys
    import tempfile

    import torch
    from _common import StepClock, emit, model_dir, read_jsonl, step_callback, trainer_args_common
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(args))
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir(args), dtype=torch.float32)
    rows = read_jsonl(args.work_dir / "data" / "prompts.jsonl")
    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in rows]})
    steps = args.warmup + args.steps
    config = GRPOConfig(
        **trainer_args_common(tempfile.mkdtemp(prefix=f"bench-{library}-{workload}-"), steps, args.seed),
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=BATCH // MICRO,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=BETA[workload],
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        log_completions=False,
        generation_kwargs=None if args.eos else {"min_new_tokens": MAX_COMPLETION},
        **library_settings,
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=count_e,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_callback(clock)],
    )
    trainer.train()
    timed = LENGTHS[BATCH * args.warmup :]  # one generation batch per step
    if len(timed) != BATCH * args.steps:
        raise RuntimeError(
            f"{library}/{workload}: scored {len(LENGTHS)} completions, expected {BATCH * steps}"
        )
    per_step = sum(timed) / args.steps
    emit(
        args,
        library,
        workload,
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=BATCH,
        tokens_per_step=per_step,
        response_length=MAX_COMPLETION,
        beta=BETA[workload],
        completion_lengths={
            "min": min(timed),
            "median": statistics.median(timed),
            "mean": statistics.fmean(timed),
            "max": max(timed),
            "all": timed,
        },
        has_ref_model=getattr(trainer, "ref_model", None) is not None,
        trainer_file=sys.modules[GRPOTrainer.__module__].__file__,
    )
