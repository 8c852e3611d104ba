"""A byte-level BPE tokenizer (~1000 tokens) trained on the English text shipped in `data/`.

Byte-level means any string round-trips exactly, so tests can use arbitrary text. It behaves
like a small GPT-2 tokenizer with a few deliberate differences: padding has its own token
(`<|pad|>`, never the EOS token, so reward models and masks can tell them apart), padding is on
the left (what generation wants), the tokenizer never emits `token_type_ids` (GPT-2 would add
them as segment embeddings and Llama classifiers reject them), and a minimal chat template
with role-marker special tokens is attached.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from rlhfkit.testing.cache import cache_root, publish_once

VOCAB_SIZE = 1000
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS)  # ids 0..4 in this order

# Each message is "<|role|>\n{content}<|endoftext|>\n"; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|endoftext|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# The same rendering, with the assistant turns (content and closing EOS) inside {% generation %} blocks, which
# transformers' return_assistant_tokens_mask (and so SFTConfig(assistant_only_loss=True)) needs.
GENERATION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] + '<|endoftext|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|endoftext|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

CORPUS_FILE = "corpus.txt"


def corpus_text() -> str:
    """The English text (everyday sentences and short movie reviews) the tokenizer is trained on."""
    return (
        resources.files("rlhfkit.testing").joinpath("data").joinpath(CORPUS_FILE).read_text(encoding="utf-8")
    )


def _train_backend():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return tok


def _build_tokenizer(out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_backend(),
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)


def tiny_tokenizer_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder with the tiny tokenizer, trained and saved on first use (loads with AutoTokenizer)."""
    return publish_once(cache_root(cache_dir) / "tokenizer", "tokenizer.json", _build_tokenizer)


def tiny_tokenizer(cache_dir: str | os.PathLike | None = None, padding_side: str = "left"):
    """The tiny tokenizer as a `PreTrainedTokenizerFast`; `padding_side` is "left" or "right"."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_path(cache_dir), padding_side=padding_side)
