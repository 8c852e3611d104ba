"""`rlhfkit ddpo`: DDPO fine-tuning of a Stable Diffusion pipeline on a built-in image reward.

    rlhfkit ddpo --reward compressibility --num_epochs 10 --sample_num_steps 20 \
        [--pretrained_model PATH] [--prompts "a cat,a dog"] [--output_dir out] [--config ddpo.yaml]

Without --pretrained_model the offline tiny pipeline from `rlhfkit.testing` is used. Rewards need
no model: JPEG size (the DDPO paper's compressibility tasks) or mean brightness.
"""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfkit.commands._args import local_folder, parse_args, run_main, start_run, stopped_early
from rlhfkit.trainers.common.checkpointing import latest_checkpoint, lock_output_dir
from rlhfkit.trainers.common.config import option
from rlhfkit.trainers.ddpo.config import DDPOConfig

PROG = "rlhfkit ddpo"


def jpeg_size_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """JPEG file size in kilobytes of each image in a (B, 3, H, W) batch with values in [0, 1]."""
    from PIL import Image

    pixels = (
        (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    )
    sizes = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes)


def compressibility(images: torch.Tensor, prompts: Any, metadata: Any) -> tuple[torch.Tensor, dict]:
    """Smaller JPEG files score higher (DDPO paper)."""
    return -jpeg_size_kb(images), {}


def incompressibility(images: torch.Tensor, prompts: Any, metadata: Any) -> tuple[torch.Tensor, dict]:
    """Larger JPEG files score higher (DDPO paper)."""
    return jpeg_size_kb(images), {}


def brightness(images: torch.Tensor, prompts: Any, metadata: Any) -> tuple[torch.Tensor, dict]:
    """Mean pixel value in [0, 1]."""
    return images.float().mean(dim=(1, 2, 3)).cpu(), {}


REWARDS = {
    "compressibility": compressibility,
    "incompressibility": incompressibility,
    "brightness": brightness,
}
DEFAULT_PROMPTS = "a cat,a dog,a horse,a bird,a red flower,a blue sky"


@dataclass
class DDPOScriptArguments:
    pretrained_model: str | None = option(
        None, "Stable Diffusion folder or hub id; default: the offline tiny pipeline."
    )
    pretrained_revision: str | None = option(None, "Revision of --pretrained_model.")
    reward: str = option("compressibility", f"Reward: {' | '.join(REWARDS)}.")
    prompts: str = option(DEFAULT_PROMPTS, "Comma-separated prompts, drawn at random.")
    lora_rank: int = option(4, "LoRA rank when --train_use_lora (the default).")
    output_dir: str | None = option(
        None, "Where the trained weights go at the end (LoRA weights or a full pipeline)."
    )
    resume_from_checkpoint: str | None = option(
        None, "The other commands' name for --resume_from (a checkpoint folder, or a folder of them)."
    )

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"--reward must be one of {', '.join(REWARDS)}, got {self.reward!r}")
        if not [p for p in self.prompts.split(",") if p.strip()]:
            raise ValueError("--prompts must hold at least one non-empty prompt")


def _train(argv: list[str] | None) -> int:
    from accelerate.utils import set_seed

    from rlhfkit.models.sd_pipeline import DefaultDDPOStableDiffusionPipeline
    from rlhfkit.trainers.ddpo.trainer import DDPOTrainer

    config, args = parse_args((DDPOConfig, DDPOScriptArguments), argv, PROG, __doc__.splitlines()[0])
    if args.resume_from_checkpoint is not None:
        if config.resume_from and config.resume_from != args.resume_from_checkpoint:
            raise ValueError("give --resume_from or --resume_from_checkpoint (one name), not two folders")
        config.resume_from = args.resume_from_checkpoint
    # before the pipeline is loaded: the checkpoint --resume_from names, and the folders' locks
    checkpoints = Path(config.logdir) / config.run_name / "checkpoints"
    resume = start_run(
        PROG, str(checkpoints), config.resume_from or None, None, config.trust_unverified_checkpoint,
        max_steps=config.num_epochs, max_steps_flag="--num_epochs",
    )  # fmt: skip
    config.resume_from = "" if resume is None else str(resume)
    if args.output_dir and int(os.environ.get("RANK", "0")) == 0:
        lock_output_dir(args.output_dir)
    model = args.pretrained_model
    if model is None:
        from rlhfkit.testing.diffusion import tiny_sd_pipeline_path

        model = str(tiny_sd_pipeline_path())
    else:
        local_folder(model, "--pretrained_model")
    # The LoRA weights are drawn when the pipeline is built, before DDPOTrainer seeds: seed first, or two
    # runs with the same --seed start from different LoRA A matrices (B is zero, so epoch 0 still agrees).
    set_seed(config.seed)
    pipeline = DefaultDDPOStableDiffusionPipeline(
        model,
        pretrained_model_revision=args.pretrained_revision,
        use_lora=config.train_use_lora,
        lora_rank=args.lora_rank,
    )
    prompts = [p.strip() for p in args.prompts.split(",") if p.strip()]
    rng = random.Random(config.seed)

    def prompt_fn() -> tuple[str, dict]:
        return rng.choice(prompts), {}

    trainer = DDPOTrainer(config, REWARDS[args.reward], prompt_fn, pipeline)
    trainer.train()
    if trainer.first_epoch < config.num_epochs:  # SIGINT/SIGTERM ended it early: no final weights
        last = latest_checkpoint(trainer.checkpoint_dir)
        return stopped_early(PROG, trainer.graceful_stop, last, trainer.first_epoch, flag="--resume_from")
    for entry in trainer.log_history:
        if "reward_mean" in entry:
            print(f"epoch {entry['epoch']}: mean {args.reward} reward {entry['reward_mean']:.4f}")
    if args.output_dir:
        trainer.save_pretrained(args.output_dir)
        print(f"saved to {args.output_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _train, argv)
