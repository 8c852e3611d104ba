"""Offline tiny models and tokenizer for tests, examples and the demo.

Everything is built locally from text shipped with the package (no downloads), deterministically,
and cached on disk: `tiny_model_path("llama")` returns a folder that plain
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` can load.
"""

from rlhfkit.testing.cache import FORMAT_VERSION, cache_root
from rlhfkit.testing.models import TINY_MODEL_NAMES, tiny_model, tiny_model_path, tiny_value_head_model
from rlhfkit.testing.tokenizer import tiny_tokenizer, tiny_tokenizer_path

__all__ = [
    "FORMAT_VERSION",
    "TINY_MODEL_NAMES",
    "cache_root",
    "tiny_model",
    "tiny_model_path",
    "tiny_tokenizer",
    "tiny_tokenizer_path",
    "tiny_value_head_model",
]
