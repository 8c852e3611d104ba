"""Local stand-ins for the hub model ids TRL's tests load (`trl-internal-testing/tiny-<Class>...`).

The id names a transformers class; the stand-in is that class built from its own config with tiny
sizes, random seeded weights, and a byte-level tokenizer derived from `rlhfkit.testing`'s (with
ChatML turn markers and a chat template that renders tools, as the tiny Qwen models' do). Ids that
need more than a tokenizer (vision-language models with image processors) or that do not name a
class raise `HarnessUnmapped`: the harness, not rlhfkit, cannot run those tests, and the report
counts them apart. A few ids have stand-ins of their own (`_SPECIAL`): the custom-code model
(hub_remote_model.py) and a Qwen3 checkpoint named only for its chat template (hub_templates.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hub_templates import CHATML, CHATML_TOKENS, HARMONY, HARMONY_TOKENS, QWEN3

from rlhfkit.testing.cache import cache_root, publish_once
from rlhfkit.testing.models import SEED
from rlhfkit.testing.tokenizer import tiny_tokenizer_path


class HarnessUnmapped(RuntimeError):
    """The harness has no local stand-in for a hub model or dataset a test asks for."""


_ID = re.compile(r"^trl-internal-testing/(?:tiny-random-|tiny-|dummy-)(?P<cls>[A-Za-z0-9_]+?)(?:-[\w.-]+)?$")
# ids that are not "tiny-<transformers class>"
_ALIASES = {"gpt2": "GPT2LMHeadModel", "GPT2": "GPT2LMHeadModel"}

# Tiny sizes, applied to whichever of these names a config has (names differ across architectures).
_SIZES = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=2048, n_positions=2048, n_ctx=2048,
    d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=128, decoder_ffn_dim=128, ffn_dim=128, word_embed_proj_dim=64,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=16, rotary_dim=8,
    attention_dropout=0.0, hidden_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, dropout=0.0,
    dropout_rate=0.0, tie_word_embeddings=True, num_encoder_layers=2,
    attention_types=[[["global", "local"], 1]],
)  # fmt: skip
# sizes a config refuses to take under that name (it wants the encoder/decoder names instead)
_REFUSED = {"ProphetNetConfig": {"num_hidden_layers"}}

# layers an id's stand-in has instead of 2: v0.11.4's value-head tests read layer index 4 of this one, as
# TRL's copy has 5 (only this id: others keep the random weights their tests' outcomes were measured on)
_LAYERS = {"trl-internal-testing/tiny-random-GPT2LMHeadModel": 5}


def _root() -> Path:
    return cache_root() / "trl-suite-v4"


def _build_tokenizer(out: Path, tokens=CHATML_TOKENS, eos="<|im_end|>", template=CHATML) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_path())
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    tokenizer.padding_side = "right"  # the transformers default; trainers that generate set "left" themselves
    tokenizer.save_pretrained(out)


def tokenizer_dir() -> Path:
    """The harness tokenizer: rlhfkit's tiny BPE, ChatML markers, EOS `<|im_end|>`, right padding."""
    return publish_once(_root() / "tokenizer", "tokenizer.json", _build_tokenizer)


def harmony_tokenizer_dir() -> Path:
    """The gpt-oss stand-in's tokenizer: the same BPE with harmony's markers, EOS `<|return|>`."""
    build = lambda out: _build_tokenizer(out, HARMONY_TOKENS, "<|return|>", HARMONY)  # noqa: E731
    return publish_once(_root() / "tokenizer-harmony", "tokenizer.json", build)


# model families whose stand-in renders chats its own way (every other model uses `tokenizer_dir`)
_TOKENIZER_OF = {"GptOssForCausalLM": harmony_tokenizer_dir}


def model_class(model_id: str):
    """The transformers class a hub id names, or `HarnessUnmapped`."""
    import transformers

    match = _ID.match(model_id)
    name = _ALIASES.get(model_id) or (match and _ALIASES.get(match["cls"], match["cls"]))
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise HarnessUnmapped(f"no local stand-in for hub model {model_id!r}")
    if getattr(cls.config_class, "sub_configs", None):
        raise HarnessUnmapped(f"no local stand-in for multimodal model {model_id!r} ({name})")
    return cls


def _tiny_config(cls, tokenizer, layers: int | None = None):
    default = cls.config_class()
    refused = _REFUSED.get(cls.config_class.__name__, set())
    sizes = {key: value for key, value in _SIZES.items() if hasattr(default, key) and key not in refused}
    if layers is not None and "num_hidden_layers" in sizes:
        sizes["num_hidden_layers"] = layers
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    special["pad_token_id"] = tokenizer.pad_token_id
    if default.is_encoder_decoder:
        special["decoder_start_token_id"] = tokenizer.pad_token_id
    config = cls.config_class(vocab_size=len(tokenizer), **sizes, **special)
    if cls.__name__.endswith("ForSequenceClassification"):
        config.num_labels = 1
    return config


def _build_model(model_id: str, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    cls = model_class(model_id)
    tokenizer = AutoTokenizer.from_pretrained(_TOKENIZER_OF.get(cls.__name__, tokenizer_dir)())
    config = _tiny_config(cls, tokenizer, _LAYERS.get(model_id))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = cls(config)
    if model.can_generate():
        gen = {key: getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
        if config.is_encoder_decoder:
            gen["decoder_start_token_id"] = config.decoder_start_token_id
        model.generation_config = GenerationConfig(**gen)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _build_qwen3_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    tokenizer.chat_template = QWEN3
    tokenizer.save_pretrained(out)


def _build_remote_model(out: Path) -> None:
    from hub_remote_model import build_remote_model
    from transformers import AutoTokenizer

    build_remote_model(out, _tiny_config, AutoTokenizer.from_pretrained(tokenizer_dir()))


# ids whose stand-in is not "a transformers class with tiny sizes": (builder, a file every finished copy has)
_SPECIAL = {
    "trl-internal-testing/tiny-RemoteForCausalLM": (_build_remote_model, "modeling_remote.py"),
    # named as a `chat_template_path` only: a tokenizer with a Qwen3-style template, no weights
    "Qwen/Qwen3-4B": (_build_qwen3_tokenizer, "tokenizer_config.json"),
}


def local_model_dir(model_id: str) -> Path:
    """Folder holding the stand-in for `model_id` (built once, cached under rlhfkit's test cache)."""
    build, marker = _SPECIAL.get(model_id, (None, "config.json"))
    if build is None:
        model_class(model_id)  # refuse unmapped ids before building anything
        build = lambda out: _build_model(model_id, out)  # noqa: E731
    safe = model_id.replace("/", "--")
    return publish_once(_root() / "models" / safe, marker, build)


def is_hub_id(value: object) -> bool:
    """A string that names a hub repository rather than a local folder."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/")) or text in _ALIASES
    return looks_like_repo and not os.path.exists(text)
