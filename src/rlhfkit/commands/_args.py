"""Command-line plumbing shared by the training commands: one HfArgumentParser plus `--config file.yaml`.

Values from the YAML file become parser defaults, so flags given on the command line still win.
`ScriptArguments` says where the data is, `ModelArguments` which model to load and whether to wrap
it in LoRA. A Trainer-style command (sft, dpo, reward) is a `TrainerCommand` spec: which trainer,
config and model class, and what to print at the end; `run_trainer_command` does the rest (parse,
load data, tokenizer and model, train, save, evaluate, print a JSON summary). The online commands
(ppo, rloo) use the same `ModelArguments`, `load_tokenizer` and `peft_config_from`; grpo is a
`TrainerCommand` with its own script arguments and `inputs` (prompts and reward functions). User errors
(ValueError, an output folder another run holds) become one line on stderr and exit code 2 (`run_main`).

Every training command starts and ends a run the same way: `start_run` (before any model is loaded) takes
the output folder's lock and finds the checkpoint `--resume_from_checkpoint` names (True/"true": the newest
in the output folder; a checkpoint folder; an output folder: its newest), which the trainer then resumes
from; a run that SIGINT/SIGTERM stopped writes no final model and ends with `stopped_early`: one line
naming its last checkpoint and the flag that continues it, and exit code 130 (SIGINT) or 143 (SIGTERM).
Flags cannot be abbreviated (`--learning_rat` is an error, not --learning_rate).

Set RLHFKIT_DEBUG=1 to get the full traceback instead of the one-line error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfkit.commands._imports import import_object
from rlhfkit.data.loading import offline_error
from rlhfkit.trainers.common.config import option


@dataclass
class ScriptArguments:
    """Where the training data comes from (a local path: this machine is offline)."""

    dataset_name: str | None = option(
        None, "Local dataset: a .json/.jsonl/.csv/.parquet file, a folder of them, or a save_to_disk folder."
    )
    dataset_train_split: str = option("train", "Split to train on.")
    dataset_test_split: str = option(
        "test", "Split to evaluate on; skipped when the dataset has no such split."
    )


@dataclass
class ResumeArguments:
    """How far a resumed run trusts its checkpoint (the folder itself is --resume_from_checkpoint)."""

    trust_unverified_checkpoint: bool = option(
        False,
        "Resume from a checkpoint folder that has no manifest.json (written elsewhere, or altered), whose "
        "files cannot be verified: it is loaded with a warning instead of refused.",
    )


@dataclass
class ModelArguments:
    """Which model to load, and optional LoRA."""

    model_name_or_path: str | None = option(None, "Local model folder (e.g. from `rlhfkit tiny-models`).")
    tokenizer_name_or_path: str | None = option(None, "Tokenizer folder; defaults to model_name_or_path.")
    trust_remote_code: bool = option(False, "Allow custom model code from the folder.")
    dtype: str = option("auto", "Weight dtype: 'auto', 'float32', 'bfloat16' or 'float16'.")
    use_peft: bool = option(False, "Train LoRA adapters instead of all weights.")
    lora_r: int = option(16, "LoRA rank.")
    lora_alpha: int = option(32, "LoRA scaling numerator (scale = alpha / r).")
    lora_dropout: float = option(0.05, "Dropout on the LoRA branch.")
    lora_target_modules: list[str] | None = option(
        None, "Module names to adapt; default: PEFT's choice for the architecture."
    )
    lora_modules_to_save: list[str] | None = option(
        None, "Extra modules trained fully and saved with the adapter."
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
    """Parse argv (plus an optional `--config file.yaml`) into one instance of each dataclass
    (`HfArgumentParser`'s flags).

    A field that several dataclasses declare (`trust_remote_code`: the trainer's config and the model
    arguments) is one flag, and every dataclass gets its value.
    """
    import yaml
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    config_path, argv = _split_config_flag(argv)
    parser = HfArgumentParser(
        dataclass_types, prog=prog, description=description, allow_abbrev=False, conflict_handler="resolve"
    )
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
    namespace, remaining = parser.parse_known_args(args=argv)
    if remaining:
        parser.error(f"unrecognised arguments: {' '.join(remaining)}{_did_you_mean(parser, remaining)}")
    values = vars(namespace)  # each dataclass takes its fields' values; a shared field's go to every one
    return tuple(
        dtype(**{f.name: values[f.name] for f in dataclasses.fields(dtype) if f.init and f.name in values})
        for dtype in dataclass_types
    )


def _did_you_mean(parser: Any, remaining: list[str]) -> str:
    import difflib

    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = [
        f"{arg.split('=')[0]} -> {close[0]}"
        for arg in remaining
        if arg.startswith("--") and (close := difflib.get_close_matches(arg.split("=")[0], flags, n=1))
    ]
    return f" (did you mean: {', '.join(hints)}?)" if hints else ""


def require(value: Any, flag: str) -> Any:
    if value in (None, ""):
        raise ValueError(f"{flag} is required")
    return value


def local_folder(path: str | None, flag: str) -> str:
    """`path` when it exists on disk; otherwise the offline error naming `flag`.

    Hub names are not fetched.
    """
    if not Path(require(path, flag)).exists():
        raise offline_error(flag, path)
    return path


def load_tokenizer(model_args: ModelArguments, padding_side: str = "right"):
    from transformers import AutoTokenizer

    if model_args.tokenizer_name_or_path:
        path = local_folder(model_args.tokenizer_name_or_path, "--tokenizer_name_or_path")
    else:
        path = local_folder(model_args.model_name_or_path, "--model_name_or_path")
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
    path = local_folder(model_args.model_name_or_path, "--model_name_or_path")
    return auto_class.from_pretrained(path, **model_init_kwargs(model_args), **extra)


def peft_config_from(model_args: ModelArguments, task_type: str):
    """A LoraConfig from the flags, or None when --use_peft is off."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        task_type=task_type, r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout, target_modules=model_args.lora_target_modules,
        modules_to_save=model_args.lora_modules_to_save,
    )  # fmt: skip


def load_data(script_args: ScriptArguments):
    """(train, eval or None) from --dataset_name and the split flags."""
    from rlhfkit.data.loading import load_splits

    name = require(script_args.dataset_name, "--dataset_name")
    return load_splits(name, script_args.dataset_train_split, script_args.dataset_test_split)


def load_prompts(
    name: str | None, train_split: str = "train", test_split: str | None = None, num_eval_prompts: int = 16
):
    """(train, eval or None, task or None) for the online commands: a built-in task name or a local dataset.

    A task gives its own train prompts and `num_eval_prompts` test prompts; a local dataset its splits.
    """
    from rlhfkit.data.loading import load_splits
    from rlhfkit.tasks import get_task, task_names

    if name is None:
        raise ValueError(
            f"--dataset_name is required: a local dataset path or a built-in task ({', '.join(task_names())})"
        )
    if name in task_names() and not Path(name).exists():
        task = get_task(name)
        return task.prompt_dataset("train"), task.prompt_dataset("test", n=num_eval_prompts), task
    try:
        train, evaluation = load_splits(name, train_split, test_split)
    except ValueError as err:
        if Path(name).exists():
            raise
        raise ValueError(f"{err}; or use a built-in task: {', '.join(task_names())}") from err
    return train, evaluation, None


def summary_json(summary: dict[str, Any]) -> str:
    """A command's closing summary as strict JSON: a NaN or infinite figure is written as null."""

    def finite(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(item) for item in value]
        number = value if isinstance(value, (int, float, str, bool)) or value is None else float(value)
        return None if isinstance(number, float) and not math.isfinite(number) else number

    return json.dumps(finite(summary), allow_nan=False)


def run_main(prog: str, body, argv: list[str] | None) -> int:
    """Run a command body; user errors (and an output folder another run holds) print one clear line and
    exit code 2 instead of a traceback; a run stopped by `NonFiniteError` (too many skipped steps in a
    row: NaN or inf losses, gradients or rewards) one line and 1; a second SIGINT/SIGTERM, which stops
    without a checkpoint, 130."""
    from rlhfkit.trainers.common.atomic_folders import CheckpointLockError
    from rlhfkit.trainers.common.guards import NonFiniteError

    try:
        return int(body(argv) or 0)
    except (ValueError, FileNotFoundError, CheckpointLockError, NonFiniteError) as err:
        if os.environ.get("RLHFKIT_DEBUG"):
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, NonFiniteError) else 2
    except KeyboardInterrupt as err:
        if os.environ.get("RLHFKIT_DEBUG"):
            raise
        why = err or "stopped at once, without saving a checkpoint"
        print(f"{prog}: interrupted: {why}", file=sys.stderr)
        return 130


def start_run(
    prog: str,
    output_dir: str,
    resume_from_checkpoint: str | bool | None,
    args: Any = None,
    trust_unverified_checkpoint: bool = False,
    **limits: Any,
) -> Path | None:
    """Before any model is loaded: the verified checkpoint `resume_from_checkpoint` names (None: a fresh
    run; `trust_unverified_checkpoint`: one without a manifest is taken, warned) and, on the main process,
    the output folder's lock.

    A path that does not exist or holds no intact checkpoint, a max_steps below the checkpoint's step
    (`args.max_steps`, or `max_steps=`/`max_steps_flag=` in `limits`), or a folder another live run holds
    raise the errors `run_main` prints as one line (exit 2). The trainer resumes from the returned folder.
    """
    from rlhfkit.trainers.common.atomic_folders import lock_output_dir
    from rlhfkit.trainers.common.checkpointing import checkpoint_to_resume
    from rlhfkit.trainers.common.resuming import check_resume_settings

    checkpoint = checkpoint_to_resume(output_dir, resume_from_checkpoint, trust_unverified_checkpoint)
    if checkpoint is not None:  # the trainer warns about changed settings when it resumes
        check_resume_settings(checkpoint, args, warn=False, **limits)
    if int(os.environ.get("RANK", "0")) == 0:  # one lock per run: the main process takes it
        lock_output_dir(output_dir)
    return checkpoint


def stopped_early(prog: str, graceful_stop: Any, checkpoint: str | os.PathLike | None, step: int,
                  flag: str = "--resume_from_checkpoint") -> int:  # fmt: skip
    """A run SIGINT/SIGTERM stopped: one line on stderr, where its last checkpoint is and the exact flag
    that continues it; returns the exit code (130 SIGINT, 143 SIGTERM). No final model is written."""
    how = f"{prog}: stopped on request ({graceful_stop.signal_name or 'a signal'}) after step {step}"
    if checkpoint is None:
        print(f"{how}; no final model and no checkpoint were written", file=sys.stderr, flush=True)
    else:
        print(
            f"{how}; no final model was written. The last checkpoint is {checkpoint}; continue with "
            f"{flag} {checkpoint}",
            file=sys.stderr,
            flush=True,
        )
    return graceful_stop.exit_code


@dataclass(frozen=True)
class TrainerCommand:
    """What one Trainer-style command adds to the shared run: its trainer, config and model class.

    `trainer` and `config` are "module:Name" strings so that `rlhfkit <command> --help` imports no
    trainer; `summary(trainer)` gives the command's own fields of the final JSON line.
    """

    prog: str
    description: str
    trainer: str
    config: str
    auto_model: str  # a transformers Auto* class name
    peft_task_type: str  # LoraConfig task_type for --use_peft
    summary: Callable[[Any], dict[str, Any]]
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    script_arguments: type = ScriptArguments
    # (script_args) -> (train, eval or None, extra trainer keywords); default: `load_data`, no extras. An
    # extra "chat_template" (a built-in task's) is set on the tokenizer; --chat_template_path replaces it
    inputs: Callable[[Any], tuple[Any, Any, dict[str, Any]]] | None = None
    evaluate: bool = True  # run trainer.evaluate() on the eval split when there is one

    def main(self, argv: list[str] | None = None) -> int:
        return run_main(self.prog, lambda args: run_trainer_command(self, args), argv)


def run_trainer_command(command: TrainerCommand, argv: list[str] | None) -> int:
    """Parse, lock the output folder and find the checkpoint to resume, load data, tokenizer and model,
    train, save, evaluate, and print one JSON summary line (a run a signal stopped: `stopped_early`)."""
    import transformers

    config_class = import_object(command.config, f"{command.prog}: config")
    trainer_class = import_object(command.trainer, f"{command.prog}: trainer")
    script_args, config, model_args, resume = parse_args(
        (command.script_arguments, config_class, ModelArguments, ResumeArguments),
        argv,
        command.prog,
        command.description,
    )
    trust = resume.trust_unverified_checkpoint
    checkpoint = start_run(command.prog, config.output_dir, config.resume_from_checkpoint, config, trust)
    if command.inputs is None:
        (train_dataset, eval_dataset), extra = load_data(script_args), {}
    else:
        train_dataset, eval_dataset, extra = command.inputs(script_args)
    tokenizer = load_tokenizer(model_args)
    template = extra.pop("chat_template", None)
    if template:  # saved with the model, so the trained policy renders its prompts the same way
        tokenizer.chat_template = template
    model = load_model(model_args, getattr(transformers, command.auto_model), **command.model_kwargs)
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config_from(model_args, command.peft_task_type),
        **extra,
    )
    trainer.train(resume_from_checkpoint=checkpoint and str(checkpoint), trust_unverified_checkpoint=trust)
    if trainer.stopped_by_signal:
        step = trainer.state.global_step
        return stopped_early(command.prog, trainer.graceful_stop, trainer.last_checkpoint, step)
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    summary = {"output_dir": config.output_dir, **command.summary(trainer)}
    if eval_dataset is not None and command.evaluate:
        summary["eval"] = trainer.evaluate()
    print(summary_json(summary))
    return 0
