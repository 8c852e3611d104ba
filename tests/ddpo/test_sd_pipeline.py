"""The tiny offline SD pipeline and DefaultDDPOStableDiffusionPipeline: sampling records, LoRA, save/load."""

from __future__ import annotations

import json

import torch
from diffusers import StableDiffusionPipeline
from safetensors.torch import load_file

from rlhfkit.testing.diffusion import IMAGE_SIZE


def test_tiny_pipeline_folder_loads_with_diffusers(sd_path):
    index = json.loads((sd_path / "model_index.json").read_text())
    assert index["scheduler"][1] == "DDIMScheduler" and index["safety_checker"] == [None, None]
    pipe = StableDiffusionPipeline.from_pretrained(sd_path)
    tokens = pipe.tokenizer.convert_ids_to_tokens(pipe.tokenizer("a photo of a cat").input_ids)
    assert tokens == ["<|startoftext|>", "a</w>", "photo</w>", "of</w>", "a</w>", "cat</w>", "<|endoftext|>"]
    # an unseen word still tokenizes through the byte alphabet, not to unknown tokens
    assert pipe.tokenizer.unk_token_id not in pipe.tokenizer("qzx").input_ids[1:-1]
    assert pipe.scheduler.config.set_alpha_to_one is False


def test_sampling_records_a_consistent_trajectory(make_pipeline):
    pipe = make_pipeline(use_lora=True)
    torch.manual_seed(0)
    out = pipe(["a cat", "a dog"], num_inference_steps=4, guidance_scale=3.0, eta=1.0)
    assert out.images.shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert 0 <= out.images.min() and out.images.max() <= 1
    assert len(out.latents) == 5 and out.latents[0].shape == (2, 4, IMAGE_SIZE // 4, IMAGE_SIZE // 4)
    assert len(out.log_probs) == 4 and all(
        lp.shape == (2,) and torch.isfinite(lp).all() for lp in out.log_probs
    )
    # re-scoring the stored transitions with the same weights gives back the recorded log-probs
    # (this is why the first PPO ratio of every epoch is exactly 1)
    embeds = pipe.encode_prompts(["a cat", "a dog"])
    neg = pipe.encode_prompts(["", ""])
    with torch.no_grad():
        for i, t in enumerate(pipe.scheduler.timesteps):
            noise = pipe.unet(
                torch.cat([out.latents[i]] * 2), t, encoder_hidden_states=torch.cat([neg, embeds])
            ).sample
            uncond, cond = noise.chunk(2)
            step = pipe.scheduler_step(
                uncond + 3.0 * (cond - uncond), t, out.latents[i], 1.0, out.latents[i + 1]
            )
            torch.testing.assert_close(step.logprobs, out.log_probs[i], rtol=1e-4, atol=1e-2)


def test_lora_trains_only_adapters_and_round_trips(make_pipeline, tmp_path):
    pipe = make_pipeline(use_lora=True, lora_rank=2)
    params = pipe.trainable_parameters()
    names = {n for n, p in pipe.unet.named_parameters() if p.requires_grad}
    assert params and all("lora" in n for n in names)
    assert not any(p.requires_grad for p in pipe.vae.parameters())
    assert not any(p.requires_grad for p in pipe.text_encoder.parameters())
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn_like(p))  # move the adapters away from their init (B starts at 0)

    latents, t, embeds = torch.randn(1, 4, 8, 8), torch.tensor(500), pipe.encode_prompts(["a cat"])
    with torch.no_grad():
        expected = pipe.unet(latents, t, encoder_hidden_states=embeds).sample

    # the trainer's checkpoint path: state dict out and back in
    fresh = make_pipeline(use_lora=True, lora_rank=2)
    fresh.load_trainable_state_dict(pipe.trainable_state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh.unet(latents, t, encoder_hidden_states=embeds).sample, expected)

    # the user's path: diffusers LoRA weights loaded into a plain StableDiffusionPipeline
    pipe.save_pretrained(tmp_path / "lora")
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert load_file(tmp_path / "lora" / "pytorch_lora_weights.safetensors")
    plain = StableDiffusionPipeline.from_pretrained(fresh.pretrained_model)
    plain.load_lora_weights(tmp_path / "lora")
    with torch.no_grad():
        torch.testing.assert_close(
            plain.unet(latents, t, encoder_hidden_states=embeds).sample, expected, rtol=1e-4, atol=1e-5
        )


def test_full_finetuning_trains_the_whole_unet_and_saves_a_pipeline(make_pipeline, tmp_path):
    pipe = make_pipeline(use_lora=False)
    assert len(pipe.trainable_parameters()) == len(list(pipe.unet.parameters()))
    pipe.save_pretrained(tmp_path / "full")
    reloaded = StableDiffusionPipeline.from_pretrained(tmp_path / "full")
    for a, b in zip(reloaded.unet.parameters(), pipe.unet.parameters()):
        assert torch.equal(a, b)
