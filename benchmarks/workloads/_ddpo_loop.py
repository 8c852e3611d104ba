"""DDPO on the tiny Stable Diffusion, written once for both libraries (rlhfkit keeps TRL 0.11's API).

Per epoch: sample 8 images x 10 DDIM steps (eta 1, guidance 5), score them (mean brightness, a cheap
stand-in reward), one inner epoch of clipped updates over every timestep with LoRA on the UNet.
"""

from __future__ import annotations

IMAGES = 8
DDIM_STEPS = 10
PROMPTS = ("a photo of a cat", "a red bird", "a small dog", "a blue fish")


def run(args, library: str, DDPOConfig, DDPOTrainer, Pipeline) -> None:  # noqa: N803
    import itertools
    import tempfile

    import torch
    from _common import StepClock, emit

    torch.manual_seed(args.seed)
    prompts = itertools.cycle(PROMPTS)

    def prompt_fn():
        return next(prompts), {}

    def reward_fn(images, prompts, metadata):
        return images.float().mean(dim=(1, 2, 3)), {}

    config = DDPOConfig(
        num_epochs=args.warmup + args.steps,
        seed=args.seed,
        logdir=tempfile.mkdtemp(prefix=f"bench-{library}-ddpo-"),
        log_with=None,
        save_freq=10_000,
        mixed_precision="no",
        sample_num_steps=DDIM_STEPS,
        sample_eta=1.0,
        sample_guidance_scale=5.0,
        sample_batch_size=IMAGES,
        sample_num_batches_per_epoch=1,
        train_batch_size=IMAGES,
        train_gradient_accumulation_steps=1,
        train_num_inner_epochs=1,
        train_timestep_fraction=1.0,
        per_prompt_stat_tracking=False,
        async_reward_computation=False,
    )
    pipeline = Pipeline(str(args.work_dir / "models" / "sd"), use_lora=True)
    trainer = DDPOTrainer(config, reward_fn, prompt_fn, pipeline)
    clock, global_step = StepClock(), 0
    clock.tick()
    for epoch in range(config.num_epochs):
        global_step = trainer.step(epoch, global_step)
        clock.tick()
    emit(
        args,
        library,
        "ddpo",
        clock.step_times(args.warmup),
        cpu_times=clock.cpu_times(args.warmup),
        episodes_per_step=IMAGES,
        tokens_per_step=IMAGES * DDIM_STEPS,
        note="tokens = image denoising steps",
    )
