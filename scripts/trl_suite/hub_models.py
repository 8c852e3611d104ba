"""Local stand-ins for the hub model ids TRL's tests load (`trl-internal-testing/tiny-<Class>...`).

The id names a transformers class; the stand-in is that class built from its own config with tiny
sizes, random seeded weights, and a byte-level tokenizer derived from `rlhfkit.testing`'s (with
ChatML turn markers and a chat template that renders tools, as the tiny Qwen models' do). Ids that
need more than a tokenizer (vision-language models with image processors) or that do not name a
class raise `HarnessUnmapped`: the harness, not rlhfkit, cannot run those tests, and the report
counts them apart.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
# ChatML turns; tools go in a system turn, tool calls as JSON between <tool_call> markers.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{ part['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- for call in message.get('tool_calls') or [] %}\n<tool_call>\n"
    "{{ {'name': (call.function or call).name, 'arguments': (call.function or call).arguments} | tojson }}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def _root() -> Path:
    return cache_root() / "trl-suite-v3"


def _build_tokenizer(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_path())
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHATML_TOKENS)})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "right"  # the transformers default; trainers that generate set "left" themselves
    tokenizer.save_pretrained(out)


def tokenizer_dir() -> Path:
    """The harness tokenizer: rlhfkit's tiny BPE, ChatML markers, EOS `<|im_end|>`, right padding."""
    return publish_once(_root() / "tokenizer", "tokenizer.json", _build_tokenizer)


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


def _tiny_config(cls, tokenizer):
    default = cls.config_class()
    refused = _REFUSED.get(cls.config_class.__name__, set())
    sizes = {key: value for key, value in _SIZES.items() if hasattr(default, key) and key not in refused}
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
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = _tiny_config(cls, tokenizer)
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


def local_model_dir(model_id: str) -> Path:
    """Folder holding the stand-in for `model_id` (built once, cached under rlhfkit's test cache)."""
    model_class(model_id)  # refuse unmapped ids before building anything
    safe = model_id.replace("/", "--")
    return publish_once(_root() / "models" / safe, "config.json", lambda out: _build_model(model_id, out))


def is_hub_id(value: object) -> bool:
    """A string that names a hub repository rather than a local folder."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/")) or text in _ALIASES
    return looks_like_repo and not os.path.exists(text)
