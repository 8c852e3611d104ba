"""Tiny randomly initialised transformers of the architectures the trainers must support.

Each name maps to a config recipe and the Auto class that loads it. Weights come from a fixed seed,
so two builds write identical tensors; every folder also carries the tiny tokenizer, so
`from_pretrained(path)` works for both model and tokenizer. Dropout is off so that train-mode
forward passes are reproducible (tests compare logprobs across batch layouts).

Reward models reuse the backbone of the causal LM of the same name and add a fresh one-output
score head, as a real pipeline would initialise a reward model from its base model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.testing.cache import cache_root, publish_once
from rlhfkit.testing.tokenizer import EOS_TOKEN, PAD_TOKEN, tiny_tokenizer_path

SEED = 20240607
MAX_POSITIONS = 512
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def _gpt2(ids: dict[str, int], size: str = "tiny"):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=ids["vocab"], n_positions=MAX_POSITIONS, n_embd=128, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, **_special_tokens(ids),
    )  # fmt: skip


def _special_tokens(ids: dict[str, int]) -> dict[str, int]:
    return {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}


def _decoder(hidden: int, mlp: int, layers: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """The sizes and settings the Llama-style decoders share: RMSNorm, no dropout, `MAX_POSITIONS`."""
    return dict(
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        attention_dropout=0.0,
    )


def _llama(ids: dict[str, int], size: str = "tiny"):
    from transformers import LlamaConfig

    dims = {
        "tiny": _decoder(128, 256, 2, 4, 2),  # ~0.6M parameters: unit tests
        # ~10M parameters: benchmarks that need a model big enough for timings to mean something
        "small": _decoder(320, 864, 8, 5, 5),
    }[size]
    return LlamaConfig(vocab_size=ids["vocab"], tie_word_embeddings=False, **dims, **_special_tokens(ids))


def _qwen2(ids: dict[str, int], size: str = "tiny"):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=ids["vocab"],
        tie_word_embeddings=True,
        use_sliding_window=False,
        **_decoder(128, 256, 2, 4, 2),
        **_special_tokens(ids),
    )


def _t5(ids: dict[str, int], size: str = "tiny"):
    from transformers import T5Config

    # T5 starts decoding from the pad token, as the original models do.
    return T5Config(
        vocab_size=ids["vocab"],
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        decoder_start_token_id=ids["pad"],
    )


@dataclass(frozen=True)
class _Spec:
    config: Callable[..., Any]
    auto_class: str  # name of the transformers Auto class that loads the folder
    size: str = "tiny"


_SPECS: dict[str, _Spec] = {
    "gpt2": _Spec(_gpt2, "AutoModelForCausalLM"),
    "llama": _Spec(_llama, "AutoModelForCausalLM"),
    "qwen2": _Spec(_qwen2, "AutoModelForCausalLM"),
    "t5": _Spec(_t5, "AutoModelForSeq2SeqLM"),
    "gpt2-reward": _Spec(_gpt2, "AutoModelForSequenceClassification"),
    "llama-reward": _Spec(_llama, "AutoModelForSequenceClassification"),
    "qwen2-reward": _Spec(_qwen2, "AutoModelForSequenceClassification"),
    "llama-small": _Spec(_llama, "AutoModelForCausalLM", size="small"),
}
TINY_MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)


def _spec(name: str) -> _Spec:
    if name not in _SPECS:
        raise ValueError(f"unknown tiny model name {name!r}; valid names are: {', '.join(TINY_MODEL_NAMES)}")
    return _SPECS[name]


def _token_ids(tokenizer_dir: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
    return {"vocab": tok.get_vocab_size(with_added_tokens=True), "eos": eos, "bos": eos, "pad": pad}


def _init_model(spec: _Spec, ids: dict[str, int]):
    """Seeded initialisation that leaves the caller's global RNG untouched."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config = spec.config(ids, spec.size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        if spec.auto_class != "AutoModelForSequenceClassification":
            return getattr(transformers, spec.auto_class).from_config(config, dtype=torch.float32)
        backbone = AutoModelForCausalLM.from_config(config, dtype=torch.float32).base_model
        config.num_labels = 1
        model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        model.base_model.load_state_dict(backbone.state_dict())
        return model


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide transformers' per-shard progress bar while saving (restoring the caller's setting)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _build_model(name: str, tokenizer_dir: Path, out_dir: Path) -> None:
    from transformers import GenerationConfig

    ids = _token_ids(tokenizer_dir)
    model = _init_model(_spec(name), ids)
    gen = dict(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    if model.config.is_encoder_decoder:
        gen["decoder_start_token_id"] = ids["pad"]
    model.generation_config = GenerationConfig(**gen)
    with _quiet_progress():
        model.save_pretrained(out_dir)
    for fname in _TOKENIZER_FILES:
        if (tokenizer_dir / fname).is_file():
            shutil.copyfile(tokenizer_dir / fname, out_dir / fname)


def tiny_model_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder of tiny model `name` (see TINY_MODEL_NAMES) with its tokenizer; built once, then cached."""
    _spec(name)
    tokenizer_dir = tiny_tokenizer_path(cache_dir)
    return publish_once(
        cache_root(cache_dir) / name, "model.safetensors", lambda out: _build_model(name, tokenizer_dir, out)
    )


def tiny_value_head_model(
    name: str = "llama", cache_dir: str | os.PathLike | None = None, **from_pretrained_kwargs: Any
):
    """Tiny causal model `name` inside `AutoModelForCausalLMWithValueHead`; kwargs go to `from_pretrained`.

    The tiny models are plain LMs, so the wrapper's "no value head found" warning is expected and silenced.
    """
    import warnings

    from rlhfkit.models.value_head import AutoModelForCausalLMWithValueHead

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="no value head found", category=UserWarning)
        return AutoModelForCausalLMWithValueHead.from_pretrained(
            tiny_model_path(name, cache_dir), **from_pretrained_kwargs
        )


def tiny_model(name: str, cache_dir: str | os.PathLike | None = None, **from_pretrained_kwargs: Any):
    """Load tiny model `name` with its transformers Auto class; kwargs go to `from_pretrained`."""
    import transformers

    auto_class = getattr(transformers, _spec(name).auto_class)
    return auto_class.from_pretrained(tiny_model_path(name, cache_dir), **from_pretrained_kwargs)
