"""rlhfkit: DDPO, 8 images x 10 DDIM steps, LoRA UNet (see _ddpo_loop.py)."""

from _common import workload_args

if __name__ == "__main__":
    args = workload_args(__doc__)
    from _ddpo_loop import run

    from rlhfkit import DDPOConfig, DDPOTrainer, DefaultDDPOStableDiffusionPipeline

    run(args, "rlhfkit", DDPOConfig, DDPOTrainer, DefaultDDPOStableDiffusionPipeline)
