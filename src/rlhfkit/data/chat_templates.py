"""`apply_chat_template_path`: replace a tokenizer's chat template by one from a file or another tokenizer.

TRL 1.x's `chat_template_path` (SFT and reward configs) names either a Jinja file (`.jinja` / `.j2`) or a
tokenizer whose template is taken: a folder, or a model name ("Qwen/Qwen3-4B") already in the local hub
cache. Only the template is taken: tokens it mentions must already be in the tokenizer's vocabulary
(checked for the other tokenizer's special tokens, which would otherwise be split into pieces), so the
model's embeddings never need resizing. `render_ids`: a conversation's token ids through the chat template,
as one flat list whatever the tokenizer or processor returns (prompts and the agent rollouts' turns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhfkit.data.loading import is_model_name, offline_error


def _tokenizer_template(source: str) -> tuple[str, list[str]]:
    """(template, special tokens) of the tokenizer in a folder, or of a hub model already in the local cache
    (nothing is downloaded: rlhfkit runs offline)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError:
        hint = "Pass a .jinja/.j2 file or a local tokenizer folder"
        raise offline_error("chat_template_path", source, hint, kind="file, folder or cached model") from None
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(f"chat_template_path={source!r}: that tokenizer has no chat template")
    return template, list(getattr(tokenizer, "all_special_tokens", []))


def read_chat_template(path: str | Path) -> tuple[str, list[str]]:
    """(template, the special tokens it comes with) from a .jinja/.j2 file, a tokenizer folder, or a model
    name as TRL takes it ("Qwen/Qwen3-4B"), read from the local hub cache."""
    text = str(path)
    path = Path(path).expanduser()
    if path.is_file() and path.suffix in (".jinja", ".j2"):
        return path.read_text(encoding="utf-8"), []
    if path.is_dir():
        return _tokenizer_template(str(path))
    if not path.exists() and is_model_name(text):
        return _tokenizer_template(text)
    raise ValueError(
        f"chat_template_path={text!r} must be a .jinja/.j2 file or a local tokenizer folder; "
        f"{'no such file or folder' if not path.exists() else 'it is neither'}"
    )


def apply_chat_template_path(tokenizer: Any, path: str | Path | None, owner: str = "") -> Any:
    """Set `tokenizer.chat_template` from `path` (None: leave it) and return the tokenizer.

    A template taken from another tokenizer is refused when that tokenizer's special tokens are not
    all in this vocabulary: the rendered chats would not contain them as single tokens.
    """
    if path is None:
        return tokenizer
    template, specials = read_chat_template(path)
    vocab = tokenizer.get_vocab()
    missing = [t for t in specials if t not in vocab]
    if missing:
        where = f"{owner}: " if owner else ""
        raise ValueError(
            f"{where}chat_template_path={str(path)!r}: its tokenizer's special tokens {missing} are not in "
            "this tokenizer's vocabulary; add them (tokenizer.add_special_tokens, then resize the model's "
            "embeddings) or use a template written for this tokenizer"
        )
    tokenizer.chat_template = template
    return tokenizer


def render_ids(
    tokenizer: Any,
    messages: list[dict],
    *,
    add_generation_prompt: bool,
    chat_template: str | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """The token ids of `messages` rendered by the chat template (a flat list)."""
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        chat_template=chat_template,
        **template_kwargs,
    )
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a processor answers with a batch of one
        ids = ids[0]
    return [int(i) for i in ids]
