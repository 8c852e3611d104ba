"""DDPO with the paper's JPEG-compressibility reward: the model learns to draw images that compress well.

    python examples/ddpo.py                  # offline tiny pipeline, ~1 minute on a CPU;
                                             # reward -1.45 -> ~-1.35
    python examples/ddpo.py --pretrained_model path/to/sd-v1-5 --train_use_lora --train_learning_rate 3e-4 \
        --sample_num_steps 50 --sample_guidance_scale 5 --train_cfg --num_epochs 100
    python examples/ddpo.py --incompressible                  # the opposite task: large JPEG files

Any DDPOConfig field is a flag. The reward needs no model: it is minus the JPEG file size in kB
(Black et al. 2023, section 6.1). For more rewards use the command line: `rlhfkit ddpo --help`.
"""

from __future__ import annotations

import io
import random
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image
from transformers import HfArgumentParser

from rlhfkit import DDPOConfig, DDPOTrainer, DefaultDDPOStableDiffusionPipeline

ANIMALS = ["cat", "dog", "horse", "bird", "rabbit", "fox", "owl", "frog"]

# One optimiser step per epoch (8 samples, batch 8). The tiny UNet is trained whole: LoRA on its
# attention layers alone moves JPEG size only slowly (pass --train_use_lora for a real SD model).
DEFAULTS = dict(
    num_epochs=12,
    sample_num_steps=10,
    sample_batch_size=8,
    sample_num_batches_per_epoch=1,
    train_batch_size=8,
    sample_guidance_scale=1.0,
    train_cfg=False,
    train_use_lora=False,
    train_learning_rate=1e-2,
    mixed_precision="no",
    logdir="runs/ddpo-compressibility",
    save_freq=6,
)


@dataclass
class ExampleArguments:
    pretrained_model: str | None = field(
        default=None, metadata={"help": "SD folder; default: tiny offline one."}
    )
    incompressible: bool = field(
        default=False, metadata={"help": "Reward large JPEG files instead of small ones."}
    )
    output_dir: str | None = field(default=None, metadata={"help": "Save the trained LoRA weights here."})


def jpeg_compressibility(images: torch.Tensor, prompts, metadata):
    """Minus the JPEG (quality 95) size in kB of each image; images are (B, 3, H, W) in [0, 1]."""
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for array in pixels:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=95)
        sizes.append(buffer.tell() / 1000)
    return -torch.tensor(sizes), {"jpeg_kb": sizes}


def main(argv: list[str]) -> None:
    parser = HfArgumentParser((DDPOConfig, ExampleArguments))
    parser.set_defaults(**DEFAULTS)
    config, args = parser.parse_args_into_dataclasses(args=argv)

    model = args.pretrained_model
    if model is None:
        from rlhfkit.testing.diffusion import tiny_sd_pipeline_path

        model = tiny_sd_pipeline_path()  # built once, offline, then cached
    pipeline = DefaultDDPOStableDiffusionPipeline(model, use_lora=config.train_use_lora)

    rng = random.Random(config.seed)

    def prompt_fn():
        return f"a photo of a {rng.choice(ANIMALS)}", {}

    def reward_fn(images, prompts, metadata):
        scores, info = jpeg_compressibility(images, prompts, metadata)
        return (-scores if args.incompressible else scores), info

    def show_samples(prompt_image_data, global_step, tracker):
        images, prompts, _, rewards, _ = prompt_image_data[0]
        print(f"step {global_step}: {prompts[0]!r} -> reward {float(rewards[0]):.3f}")

    trainer = DDPOTrainer(config, reward_fn, prompt_fn, pipeline, image_samples_hook=show_samples)
    trainer.train()
    rewards = [h["reward_mean"] for h in trainer.log_history if "reward_mean" in h]
    print("mean reward per epoch:", " ".join(f"{r:.3f}" for r in rewards))
    if args.output_dir:
        trainer.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
