"""Stable Diffusion pipelines that DDPOTrainer can sample from and train.

`DDPOStableDiffusionPipeline` is what the trainer needs: sampling that records every latent of the
trajectory and the log-probability of each denoising step, the DDIM step itself (to re-score stored
trajectories), the parameters to optimise and save/load. `DefaultDDPOStableDiffusionPipeline`
implements it around a diffusers `StableDiffusionPipeline`, training LoRA adapters on the UNet
(peft) or the whole UNet. No loss code lives here.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhfkit.core.diffusion import DDIMStepOutput, classifier_free_guidance, ddim_step_with_logprob

LORA_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")


@dataclass
class DDPOPipelineOutput:
    images: torch.Tensor  # (B, 3, H, W) in [0, 1]
    latents: list[torch.Tensor]  # num_steps + 1 tensors (B, C, h, w): x_T, ..., x_0
    log_probs: list[torch.Tensor]  # num_steps tensors (B,): log p(x_{t-1} | x_t)


class DDPOStableDiffusionPipeline(ABC):
    """What DDPOTrainer needs from a diffusion pipeline.

    Subclasses provide the components (`unet`, `vae`, `text_encoder`, `tokenizer`, `scheduler`),
    sampling (`__call__`), the trainable parameters and save/load of what training changes.
    """

    use_lora: bool = False

    @abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> DDPOPipelineOutput: ...

    @property
    @abstractmethod
    def unet(self) -> torch.nn.Module: ...

    @property
    @abstractmethod
    def vae(self) -> torch.nn.Module: ...

    @property
    @abstractmethod
    def text_encoder(self) -> torch.nn.Module: ...

    @property
    @abstractmethod
    def tokenizer(self) -> Any: ...

    @property
    @abstractmethod
    def scheduler(self) -> Any: ...

    @abstractmethod
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimiser updates (LoRA weights or the whole UNet)."""

    @abstractmethod
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything training changes, for checkpoints."""

    @abstractmethod
    def load_trainable_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def save_pretrained(self, output_dir: str | Path) -> None:
        """Save the trained model in a format diffusers loads (LoRA weights or a full pipeline)."""

    def scheduler_step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | int,
        sample: torch.Tensor,
        eta: float,
        prev_sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> DDIMStepOutput:
        return ddim_step_with_logprob(
            self.scheduler, model_output, timestep, sample, eta, prev_sample, generator
        )

    def encode_prompts(self, prompts: list[str], device: torch.device | str | None = None) -> torch.Tensor:
        """Text-encoder hidden states (B, L, D) for prompts padded to the tokenizer's max length."""
        device = device or next(self.text_encoder.parameters()).device
        ids = self.tokenizer(
            list(prompts),
            padding="max_length",
            truncation=True,
            max_length=self.tokenizer.model_max_length,
            return_tensors="pt",
        ).input_ids.to(device)
        return self.text_encoder(ids)[0]

    @property
    def autocast(self) -> Any:
        return contextlib.nullcontext

    def set_progress_bar_config(self, **kwargs: Any) -> None:  # noqa: B027 - optional hook, no-op by default
        """Configure the sampling progress bar, when the implementation has one."""


class DefaultDDPOStableDiffusionPipeline(DDPOStableDiffusionPipeline):
    """DDPO pipeline around a diffusers `StableDiffusionPipeline` loaded from a hub id or folder.

    The scheduler becomes a DDIMScheduler with `set_alpha_to_one=False`: with the final alpha
    product fixed to 1 the last step would have no noise, hence no log-probability.
    """

    def __init__(
        self,
        pretrained_model_name: str | Path,
        *,
        pretrained_model_revision: str | None = None,
        use_lora: bool = True,
        lora_rank: int = 4,
        lora_alpha: float | None = None,
        **from_pretrained_kwargs: Any,
    ):
        from diffusers import DDIMScheduler, StableDiffusionPipeline

        if lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {lora_rank}")
        kwargs = {"safety_checker": None, "requires_safety_checker": False, **from_pretrained_kwargs}
        if pretrained_model_revision is not None:
            kwargs["revision"] = pretrained_model_revision
        self.sd_pipeline = StableDiffusionPipeline.from_pretrained(str(pretrained_model_name), **kwargs)
        self.sd_pipeline.scheduler = DDIMScheduler.from_config(
            self.sd_pipeline.scheduler.config, set_alpha_to_one=False
        )
        self.use_lora = use_lora
        self.pretrained_model = str(pretrained_model_name)
        self.sd_pipeline.vae.requires_grad_(False)
        self.sd_pipeline.text_encoder.requires_grad_(False)
        self.sd_pipeline.unet.requires_grad_(not use_lora)
        if use_lora:
            from peft import LoraConfig

            config = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha or lora_rank,
                init_lora_weights="gaussian",
                target_modules=list(LORA_TARGET_MODULES),
            )
            self.sd_pipeline.unet.add_adapter(config)
        self.set_progress_bar_config(disable=True)

    # components ---------------------------------------------------------------------------------
    @property
    def unet(self) -> torch.nn.Module:
        return self.sd_pipeline.unet

    @property
    def vae(self) -> torch.nn.Module:
        return self.sd_pipeline.vae

    @property
    def text_encoder(self) -> torch.nn.Module:
        return self.sd_pipeline.text_encoder

    @property
    def tokenizer(self) -> Any:
        return self.sd_pipeline.tokenizer

    @property
    def scheduler(self) -> Any:
        return self.sd_pipeline.scheduler

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        self.sd_pipeline.set_progress_bar_config(**kwargs)

    # sampling -----------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(
        self,
        prompt: list[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        negative_prompt: str | list[str] | None = None,
        num_inference_steps: int = 50,
        guidance_scale: float = 7.5,
        eta: float = 1.0,
        generator: torch.Generator | None = None,
        height: int | None = None,
        width: int | None = None,
    ) -> DDPOPipelineOutput:
        """Sample images and record the trajectory. Classifier-free guidance runs when guidance_scale > 1."""
        if prompt_embeds is None:
            if prompt is None:
                raise ValueError("pass either `prompt` (list of strings) or `prompt_embeds`")
            prompt_embeds = self.encode_prompts(list(prompt))
        batch = prompt_embeds.shape[0]
        use_cfg = guidance_scale > 1.0
        if use_cfg and negative_prompt_embeds is None:
            negatives = (
                [negative_prompt or ""] * batch if not isinstance(negative_prompt, list) else negative_prompt
            )
            negative_prompt_embeds = self.encode_prompts(negatives)
        unet, device = self.unet, prompt_embeds.device
        scale = 2 ** (len(self.vae.config.block_out_channels) - 1)
        size = unet.config.sample_size * scale
        shape = (batch, unet.config.in_channels, (height or size) // scale, (width or size) // scale)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        latents = torch.randn(shape, generator=generator, dtype=torch.float32).to(device)
        latents = latents * self.scheduler.init_noise_sigma
        embeds = torch.cat([negative_prompt_embeds, prompt_embeds]) if use_cfg else prompt_embeds
        all_latents, all_log_probs = [latents], []
        for t in self.scheduler.timesteps:
            model_input = torch.cat([latents] * 2) if use_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            noise_pred = unet(
                model_input.to(unet.dtype), t, encoder_hidden_states=embeds.to(unet.dtype)
            ).sample
            noise_pred = classifier_free_guidance(noise_pred, guidance_scale) if use_cfg else noise_pred
            step = self.scheduler_step(noise_pred, t, latents, eta, generator=generator)
            latents = step.prev_sample
            all_latents.append(latents)
            all_log_probs.append(step.logprobs)
        return DDPOPipelineOutput(self.decode_latents(latents), all_latents, all_log_probs)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents -> images in [0, 1], (B, 3, H, W) float32."""
        vae = self.vae
        images = vae.decode((latents / vae.config.scaling_factor).to(vae.dtype)).sample
        return (images.float() / 2 + 0.5).clamp(0, 1)

    # training state -----------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.unet.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        if self.use_lora:
            from peft.utils import get_peft_model_state_dict

            return get_peft_model_state_dict(self.unet)
        return self.unet.state_dict()

    def load_trainable_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        if self.use_lora:
            from peft.utils import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.unet, state_dict)
            unexpected = getattr(result, "unexpected_keys", None)
            if unexpected:
                raise ValueError(f"LoRA checkpoint has keys this UNet does not: {unexpected[:5]}")
        else:
            self.unet.load_state_dict(state_dict)

    def save_pretrained(self, output_dir: str | Path) -> None:
        """Save the LoRA layers, or else the whole pipeline, into `output_dir`.

        LoRA goes to `pytorch_lora_weights.safetensors` (load with `pipe.load_lora_weights(dir)`).
        """
        if self.use_lora:
            from diffusers import StableDiffusionPipeline
            from diffusers.utils import convert_state_dict_to_diffusers

            layers = convert_state_dict_to_diffusers(self.trainable_state_dict())
            StableDiffusionPipeline.save_lora_weights(str(output_dir), unet_lora_layers=layers)
        else:
            self.sd_pipeline.save_pretrained(str(output_dir), safe_serialization=True)
