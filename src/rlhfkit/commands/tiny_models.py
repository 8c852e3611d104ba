"""`rlhfkit tiny-models`: build (or find in the cache) the offline tiny models and print their folders."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.testing import TINY_MODEL_NAMES, cache_root, tiny_model_path, tiny_tokenizer_path
from rlhfkit.trainers.common.config import option


@dataclass
class TinyModelsArguments:
    cache_dir: str | None = option(
        None, "Cache folder (default: $RLHFKIT_CACHE or ~/.cache/rlhfkit); a versioned subfolder is used."
    )
    names: list[str] = option(
        help=f"Models to build (default: all). Choices: {', '.join(TINY_MODEL_NAMES)}.",
        default_factory=lambda: list(TINY_MODEL_NAMES),
    )


def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(TinyModelsArguments, prog="rlhfkit tiny-models")
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    unknown = [name for name in args.names if name not in TINY_MODEL_NAMES]
    if unknown:  # checked up front so nothing is built when one name is wrong
        parser.error(
            f"--names: unknown tiny model(s) {', '.join(unknown)}; valid: {', '.join(TINY_MODEL_NAMES)}"
        )
    print(f"cache: {cache_root(args.cache_dir)}")
    print(f"{'tokenizer':<14} {tiny_tokenizer_path(args.cache_dir)}")
    for name in args.names:
        print(f"{name:<14} {tiny_model_path(name, args.cache_dir)}")
    return 0
