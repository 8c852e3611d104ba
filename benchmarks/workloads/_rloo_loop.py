"""The TRL-0.11-style RLOO trainer, written once for both libraries (rlhfkit keeps that API).

16 completions per update (4 prompts x rloo_k=4), response length 48 at fixed length (no stop token; neither
side truncates), micro-batches of 4 accumulated into one optimizer step per mini-batch.
`epochs=4` is TRL 0.11's default (4 optimizer steps per update, the "rloo-old" workload); `epochs=1` is the
"rloo" workload compared with the newest TRL, which takes one optimizer step per 16 completions.
"""

from __future__ import annotations

K = 4
BATCH = 16
MICRO = 4
RESPONSE_LENGTH = 48


def run(args, library: str, workload: str, epochs: int, RLOOConfig, RLOOTrainer) -> None:  # noqa: N803
    import tempfile

    import torch
    from _common import StepClock, emit, model_dir, read_jsonl, step_callback, trainer_args_common
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(args))
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir(args))
    ref_policy = AutoModelForCausalLM.from_pretrained(model_dir(args))
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir(args, "reward"))
    rows = read_jsonl(args.work_dir / "data" / "prompts.jsonl")
    dataset = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows]})
    steps = args.warmup + args.steps
    common = trainer_args_common(tempfile.mkdtemp(prefix=f"bench-{library}-rloo-"), steps, args.seed)
    common.pop("max_steps")
    config = RLOOConfig(
        **common, per_device_train_batch_size=MICRO, gradient_accumulation_steps=BATCH // MICRO,
        num_mini_batches=1, num_ppo_epochs=epochs, rloo_k=K, response_length=RESPONSE_LENGTH,
        total_episodes=BATCH * steps, local_rollout_forward_batch_size=BATCH, num_sample_generations=0,
        stop_token=None, temperature=0.7, kl_coef=0.05,
    )
    clock = StepClock()
    trainer = RLOOTrainer(config, tokenizer, policy, ref_policy, reward, dataset, callbacks=[step_callback(clock)])
    trainer.train()
    emit(args, library, workload, clock.step_times(args.warmup), cpu_times=clock.cpu_times(args.warmup), episodes_per_step=BATCH,
         tokens_per_step=BATCH * RESPONSE_LENGTH, response_length=RESPONSE_LENGTH, optimizer_steps_per_step=epochs)
