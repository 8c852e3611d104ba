"""Command-line plumbing shared by the training commands: one HfArgumentParser plus `--config file.yaml`.

Values from the YAML file become parser defaults, so flags given on the command line still win.
`ScriptArguments` says where the data is, `ModelArguments` which model to load and whether to wrap
it in LoRA. A command is a few lines:

    def _run(argv):
        script_args, config, model_args = parse_args((ScriptArguments, MyConfig, ModelArguments), argv, ...)
        train, evaluation = load_data(script_args)        # local files only; hub names get a clear error
        tokenizer = load_tokenizer(model_args)
        model = load_model(model_args, AutoModelForCausalLM)
        ...

    def main(argv=None):
        return run_main(PROG, _run, argv)                   # ValueError -> one line on stderr, exit code 2

Set RLHFKIT_DEBUG=1 to get the full traceback instead of the one-line error.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ScriptArguments:
    """Where the training data comes from (a local path: this machine is offline)."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Local dataset: a .json/.jsonl/.csv/.parquet file, a folder of them, or a "
            "save_to_disk folder."
        },
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(
        default="test", metadata={"help": "Split to evaluate on; skipped when the dataset has no such split."}
    )


@dataclass
class ModelArguments:
    """Which model to load, and optional LoRA."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Local model folder (e.g. from `rlhfkit tiny-models`)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder; defaults to model_name_or_path."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom model code from the folder."}
    )
    dtype: str = field(
        default="auto", metadata={"help": "Weight dtype: 'auto', 'float32', 'bfloat16' or 'float16'."}
    )
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names to adapt; default: PEFT's choice for the architecture."}
    )
    lora_modules_to_save: list[str] | None = field(
        default=None, metadata={"help": "Extra modules trained fully and saved with the adapter."}
    )

    def __post_init__(self):
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")


def _split_config_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    rest, config = [], None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise SystemExit("error: --config needs a YAML file path")
            config, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return config, rest


def parse_args(
    dataclass_types: tuple[type, ...], argv: list[str] | None, prog: str, description: str
) -> tuple:
    """Parse argv (plus an optional `--config file.yaml`) into one instance of each dataclass."""
    import yaml
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    config_path, argv = _split_config_flag(argv)
    parser = HfArgumentParser(dataclass_types, prog=prog, description=description)
    parser.add_argument("--config", help="YAML file of flag values; flags on the command line override it.")
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise SystemExit(f"error: --config file {config_path!r} does not exist")
        values = yaml.safe_load(path.read_text()) or {}
        if not isinstance(values, dict):
            raise SystemExit(f"error: --config file {config_path!r} must hold a mapping of flag: value")
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SystemExit(f"error: unknown keys in {config_path}: {', '.join(unknown)}")
        parser.set_defaults(**values)
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        parser.error(f"unrecognised arguments: {' '.join(remaining)}")
    # the extra --config flag comes back as a trailing Namespace; only the dataclasses are returned
    return tuple(parsed[: len(dataclass_types)])


def require(value: Any, flag: str) -> Any:
    if value in (None, ""):
        raise ValueError(f"{flag} is required")
    return value


def load_tokenizer(model_args: ModelArguments, padding_side: str = "right"):
    from transformers import AutoTokenizer

    path = model_args.tokenizer_name_or_path or require(model_args.model_name_or_path, "--model_name_or_path")
    if not Path(path).exists():
        raise ValueError(
            f"model {path!r} is not a local folder; rlhfkit runs offline. Build tiny models with "
            "`rlhfkit tiny-models` or pass a folder containing config.json and weights"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_init_kwargs(model_args: ModelArguments) -> dict[str, Any]:
    import torch

    dtype = model_args.dtype if model_args.dtype == "auto" else getattr(torch, model_args.dtype)
    return {"trust_remote_code": model_args.trust_remote_code, "dtype": dtype}


def load_model(model_args: ModelArguments, auto_class: type, **extra: Any):
    path = require(model_args.model_name_or_path, "--model_name_or_path")
    if not Path(path).exists():
        raise ValueError(
            f"model {path!r} is not a local folder; rlhfkit runs offline. Build tiny models with "
            "`rlhfkit tiny-models` or pass a folder containing config.json and weights"
        )
    return auto_class.from_pretrained(path, **model_init_kwargs(model_args), **extra)


def peft_config_from(model_args: ModelArguments, task_type: str):
    """A LoraConfig from the flags, or None when --use_peft is off."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        task_type=task_type,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        modules_to_save=model_args.lora_modules_to_save,
    )


def load_data(script_args: ScriptArguments):
    """(train, eval or None) from --dataset_name and the split flags."""
    from rlhfkit.data.loading import load_splits

    name = require(script_args.dataset_name, "--dataset_name")
    return load_splits(name, script_args.dataset_train_split, script_args.dataset_test_split)


def run_main(prog: str, body, argv: list[str] | None) -> int:
    """Run a command body; user errors print one clear line and exit code 2 instead of a traceback."""
    try:
        return int(body(argv) or 0)
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("RLHFKIT_DEBUG"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
