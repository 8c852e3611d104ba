"""`rlhfkit judge`: how often a policy's completions beat reference completions, with a 95% interval.

    rlhfkit judge --model_name_or_path runs/rloo --judge_model positive-review --num_examples 200

For each prompt the policy samples one completion; the judge compares it with the reference completion
(pairs are [reference, model], as in TRL's `examples/scripts/evals/judge_tldr.py`, whose flags this takes).
`--judge_model` is a local causal LM folder (asked which answer is better, both orders), a local reward-model
folder, or a built-in rule judge. Prompts and references come from `--dataset_name` (a local file or
folder with prompt and completion columns) or, by default, the built-in review openings (test split) with
the rest of each review as the reference. The win rate counts a tie as half (`rlhfkit.judges.win_rate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.commands._args import (
    ModelArguments,
    load_model,
    load_tokenizer,
    local_folder,
    model_init_kwargs,
    parse_args,
    run_main,
)
from rlhfkit.trainers.common.config import option

PROG = "rlhfkit judge"


@dataclass
class JudgeArguments:
    model_name_or_path: str | None = option(
        None, "Local folder of the policy (causal LM) whose completions are judged."
    )
    judge_model: str | None = option(
        None,
        "A local causal LM folder, a local reward-model folder, or a built-in rule judge "
        "(the reward of a built-in task scored from text: positive-review, keyword, length).",
    )
    num_examples: int | None = option(None, "Judge this many prompts (default: all).")
    dataset_name: str | None = option(
        None,
        "Local dataset (.jsonl/.json/.csv/.parquet file or folder) with prompt and reference "
        "completion columns; default: the built-in review openings with the rest of each review.",
    )
    dataset_split: str | None = option(
        None, "Split to read; default: the only one, else test/validation/train."
    )
    prompt_column: str = option("prompt", "Column holding the prompts.")
    completion_column: str = option("completion", "Column holding the references.")
    max_new_tokens: int = option(64, "Longest policy completion, in tokens.")
    temperature: float = option(1.0, "Sampling temperature of the policy (> 0).")
    seed: int = option(0, "Seed of the prompt draw (built-in prompts) and sampling.")
    batch_size: int = option(16, "Prompts per generation chunk.")
    output_file: str | None = option(
        None,
        "Optional .jsonl: one row per prompt with both completions and the verdict; an existing file is "
        "refused unless --overwrite_output_file is given.",
    )
    overwrite_output_file: bool = option(False, "Replace an existing --output_file.")
    tokenizer_name_or_path: str | None = option(
        None, "Policy tokenizer folder; defaults to model_name_or_path."
    )
    trust_remote_code: bool = option(False, "Allow custom model code from the folders.")
    dtype: str = option("auto", "Weight dtype: 'auto', 'float32', 'bfloat16' or 'float16'.")

    def __post_init__(self):
        if self.num_examples is not None and self.num_examples < 1:
            raise ValueError(f"--num_examples must be >= 1, got {self.num_examples}")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0 (the policy samples), got {self.temperature}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("--max_new_tokens and --batch_size must be >= 1")

    def model_arguments(self) -> ModelArguments:
        return ModelArguments(
            model_name_or_path=self.model_name_or_path,
            tokenizer_name_or_path=self.tokenizer_name_or_path,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
        )


def _pick_split(dataset_dict, name: str, split: str | None):
    if split is not None:
        if split not in dataset_dict:
            raise ValueError(
                f"--dataset_split {split!r} is not in {name!r} (available: {sorted(dataset_dict)})"
            )
        return dataset_dict[split]
    if len(dataset_dict) == 1:
        return next(iter(dataset_dict.values()))
    for candidate in ("test", "validation", "train"):
        if candidate in dataset_dict:
            return dataset_dict[candidate]
    raise ValueError(f"choose a split of {name!r} with --dataset_split (available: {sorted(dataset_dict)})")


def load_references(args: JudgeArguments) -> tuple[list[str], list[str]]:
    """(prompts, reference completions): from --dataset_name, or the built-in review openings."""
    if args.dataset_name is None:
        from rlhfkit.tasks import review_references

        pairs = review_references("test", n=args.num_examples, seed=args.seed)
        return [p for p, _ in pairs], [r for _, r in pairs]
    from rlhfkit.data.loading import DATASET_HINT, load_local_dataset, offline_error

    if not Path(args.dataset_name).expanduser().exists():
        raise offline_error("--dataset_name", args.dataset_name, DATASET_HINT, kind="path")
    rows = _pick_split(load_local_dataset(args.dataset_name), args.dataset_name, args.dataset_split)
    for flag, column in (
        ("--prompt_column", args.prompt_column),
        ("--completion_column", args.completion_column),
    ):
        if column not in rows.column_names:
            raise ValueError(
                f"{flag}: dataset {args.dataset_name!r} has no column {column!r} "
                f"(columns: {rows.column_names})"
            )
    if args.num_examples is not None:
        rows = rows.select(range(min(args.num_examples, len(rows))))
    prompts, references = list(rows[args.prompt_column]), list(rows[args.completion_column])
    if not prompts:
        raise ValueError(f"--dataset_name {args.dataset_name!r}: the split is empty")
    if not all(isinstance(x, str) for x in prompts + references):
        raise ValueError(
            f"--prompt_column and --completion_column must hold plain text in {args.dataset_name!r}"
        )
    return prompts, references


def check_output_file(args: JudgeArguments) -> None:
    """Refuse an --output_file that would replace a file (unless --overwrite_output_file) or is a folder."""
    if not args.output_file:
        return
    path = Path(args.output_file).expanduser()
    if path.is_dir():
        raise ValueError(f"--output_file {args.output_file!r} is a folder; name a .jsonl file")
    if path.exists() and not args.overwrite_output_file:
        raise ValueError(
            f"--output_file {args.output_file!r} already exists; pass --overwrite_output_file to replace "
            "it, or choose another path"
        )


def _write_rows(path: str, prompts, references, completions, judgements) -> None:
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8") as fh:
        for row in zip(prompts, references, completions, judgements):
            keys = ("prompt", "reference", "completion", "judgement")
            fh.write(json.dumps(dict(zip(keys, row)), ensure_ascii=False) + "\n")


def _body(argv: list[str] | None) -> int:
    (args,) = parse_args((JudgeArguments,), argv, PROG, "win rate of a policy against reference completions")
    from rlhfkit.judges import check_judge_model, load_judge, win_rate

    # every flag is checked, and the data read, before any model loads
    check_output_file(args)
    check_judge_model(args.judge_model)
    local_folder(args.model_name_or_path, "--model_name_or_path")
    prompts, references = load_references(args)
    import torch
    from transformers import AutoModelForCausalLM

    from rlhfkit.demo.sampling import sample_completions

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(args.model_arguments(), padding_side="left")
    judge = load_judge(
        args.judge_model, tokenizer, device=device, **model_init_kwargs(args.model_arguments())
    )
    policy = load_model(args.model_arguments(), AutoModelForCausalLM).to(device)
    samples = sample_completions(
        policy,
        tokenizer,
        prompts,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        chunk_size=args.batch_size,
    )
    judgements = judge.judge(
        prompts, [[ref, completion] for ref, completion in zip(references, samples.texts)]
    )
    rate, low, high = win_rate(judgements, model_index=1)
    wins, ties = judgements.count(1), judgements.count(-1)
    if args.output_file:
        _write_rows(args.output_file, prompts, references, samples.texts, judgements)
    print(
        f"Model win rate: {rate:.2%} (95% CI {low:.2%} - {high:.2%}; {len(judgements)} pairs: {wins} wins, "
        f"{ties} ties, {len(judgements) - wins - ties} losses; ties count half)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, _body, argv)
