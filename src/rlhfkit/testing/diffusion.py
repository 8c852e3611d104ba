"""A tiny Stable Diffusion pipeline, built offline, for DDPO tests, examples and the command.

The folder has the layout `StableDiffusionPipeline.from_pretrained(path)` expects: a tiny
UNet2DConditionModel, AutoencoderKL, CLIPTextModel, a CLIP BPE tokenizer trained here on a short
word list, and a DDIMScheduler (set_alpha_to_one=False, so every step is stochastic under eta > 0).
Images are 32x32 (latents 4x8x8): a 10-step sampling pass takes a fraction of a second on a CPU.
Building is seeded and deterministic, and cached like the other tiny models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlhfkit.testing.cache import cache_root, publish_once

TINY_SD_NAME = "stable-diffusion"
IMAGE_SIZE = 32
TEXT_MAX_LENGTH = 16
SEED = 1234

# A small prompt vocabulary: the tokenizer learns merges for these words; anything else still
# tokenizes through the byte-level alphabet.
_WORDS = (
    "a an the of in on with and photo painting picture drawing image of cat dog horse bird fish cow "
    "sheep rabbit bear lion tiger monkey frog duck owl fox wolf deer pig goat mouse elephant zebra "
    "red green blue yellow black white bright dark small big happy cute old young sky sea forest "
    "city house tree flower mountain river field snow sun moon night day riding eating playing "
    "sitting running flying swimming cartoon realistic style high quality detailed"
).split()


def _train_clip_bpe(out_dir: Path) -> None:
    """Train a CLIP-style BPE (words end in '</w>') and save it as a transformers CLIPTokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    specials = ["<|startoftext|>", "<|endoftext|>"]
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>", unk_token=specials[1]))
    # split like CLIPTokenizer does (on whitespace, no "G-dot" space marker), so the merges apply
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=specials,
        initial_alphabet=alphabet,
        end_of_word_suffix="</w>",
        show_progress=False,
    )
    bpe.train_from_iterator([" ".join(_WORDS)] * 4, trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    for char in sorted(alphabet):  # CLIP also needs every single byte as a word ending
        vocab.setdefault(char + "</w>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TEXT_MAX_LENGTH)
    tokenizer.save_pretrained(out_dir)


def _components(vocab_size: int, pad_token_id: int, bos: int, eos: int) -> dict[str, Any]:
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    unet = UNet2DConditionModel(
        sample_size=IMAGE_SIZE // 4,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        sample_size=IMAGE_SIZE,
        layers_per_block=1,
        block_out_channels=(8, 16, 16),
        norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=TEXT_MAX_LENGTH,
            projection_dim=32,
            pad_token_id=pad_token_id,
            bos_token_id=bos,
            eos_token_id=eos,
        )
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type="epsilon",
    )
    return {"unet": unet, "vae": vae, "text_encoder": text_encoder, "scheduler": scheduler}


def _build_pipeline(out_dir: Path) -> None:
    import torch
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    tok_dir = out_dir / "tokenizer"
    _train_clip_bpe(tok_dir)
    tokenizer = CLIPTokenizer.from_pretrained(tok_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        parts = _components(
            len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
        )
    pipe = StableDiffusionPipeline(
        **parts,
        tokenizer=tokenizer,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out_dir, safe_serialization=True)


def tiny_sd_pipeline_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder of the tiny Stable Diffusion pipeline; built once, then cached."""
    return publish_once(cache_root(cache_dir) / TINY_SD_NAME, "model_index.json", _build_pipeline)
