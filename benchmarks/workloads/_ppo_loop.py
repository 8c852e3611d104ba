"""The classic PPO loop, written once for both libraries (they share TRL 0.11's API).

Per step: take `BATCH` prompts, `trainer.generate` the responses (fixed length unless --eos), score
prompt + response with the reward model, `trainer.step`. Equal work on both sides: the same prompts, the
same number of generated tokens and 4 PPO epochs x (16 / 4) minibatches = 16 optimizer steps per step.
"ppo-lv" (issue 16's large-vocabulary setting) runs one PPO epoch over 6-token queries, `--length` tokens.
With --device cuda the trainer's accelerator picks the GPU and the prompts and the reward model follow it;
with the default cpu it is told to stay on the CPU even where a GPU exists.
"""

from __future__ import annotations

BATCH = 16
MINI_BATCH = 4
PPO_EPOCHS = 4
RESPONSE_LENGTH = 48


def run(args, library: str, PPOConfig, PPOTrainer, ValueHeadModel, workload: str = "ppo") -> None:  # noqa: N803
    import time

    import torch
    from _common import StepClock, data_dir, emit, length_summary, model_dir, read_jsonl, sync
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(args))
    tokenizer.padding_side = "left"
    model = ValueHeadModel.from_pretrained(model_dir(args))
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir(args, "reward")).eval()
    config = PPOConfig(
        batch_size=BATCH,
        mini_batch_size=MINI_BATCH,
        gradient_accumulation_steps=1,
        ppo_epochs=1 if workload == "ppo-lv" else PPO_EPOCHS,
        learning_rate=1e-5,
        seed=args.seed,
        log_with=None,
        # only where it matters (a CPU run on a GPU machine), so the CPU runs' config is unchanged elsewhere
        **(
            {"accelerator_kwargs": {"cpu": True}}
            if args.device == "cpu" and torch.cuda.is_available()
            else {}
        ),
    )
    trainer = PPOTrainer(config=config, model=model, ref_model=None, tokenizer=tokenizer)
    device = trainer.accelerator.device
    reward = reward.to(device)
    prompts = [
        torch.tensor(row["input_ids"], device=device) for row in read_jsonl(data_dir(args) / "prompts.jsonl")
    ]
    length = args.length or RESPONSE_LENGTH
    gen = dict(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        max_new_tokens=length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if not args.eos:
        gen["min_new_tokens"] = length
    clock, generated, phases, lengths = StepClock(), [], [], []
    clock.tick()
    for step in range(args.warmup + args.steps):
        start = (step * BATCH) % len(prompts)
        queries = prompts[start : start + BATCH]
        t0 = time.perf_counter()
        responses = trainer.generate(queries, batch_size=BATCH, return_prompt=False, **gen)
        sync()
        t1 = time.perf_counter()
        generated.append(sum(len(r) for r in responses))
        if step >= args.warmup:
            lengths += [len(r) for r in responses]
        full = [torch.cat([q, r]) for q, r in zip(queries, responses)]
        width = max(len(x) for x in full)
        ids = torch.full((len(full), width), tokenizer.pad_token_id, device=device)
        mask = torch.zeros((len(full), width), dtype=torch.long, device=device)
        for i, x in enumerate(full):
            ids[i, width - len(x) :], mask[i, width - len(x) :] = x, 1
        with torch.no_grad():
            scores = reward(input_ids=ids, attention_mask=mask).logits[:, 0]
        sync()
        t2 = time.perf_counter()
        stats = trainer.step(queries, responses, list(scores))
        clock.tick()
        # where a step's time goes: both trainers report TRL's time/ppo/* keys
        phase = {"generate": t1 - t0, "reward_model": t2 - t1}
        phase.update({k.split("/")[-1]: float(v) for k, v in stats.items() if k.startswith("time/ppo/")})
        phases.append(phase)
    timed = generated[args.warmup :]
    timed_phases = phases[args.warmup :]
    phase_means = {k: sum(p.get(k, 0.0) for p in timed_phases) / len(timed_phases) for k in timed_phases[0]}
    emit(
        args,
        library,
        workload,
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=BATCH,
        tokens_per_step=sum(timed) / len(timed),
        response_length=length,
        phases=phase_means,
        lengths=length_summary(lengths),
    )
