"""One `--judge_model` value to a judge: a local reward-model folder, a local causal-LM folder, or a built-in
rule judge (the reward of a built-in task: `positive-review`, `keyword`, `length`).

Offline: a name that is neither on disk nor built in is refused with the flag's name and the built-in
choices, never downloaded. Only the rule judge asked for is built, so `positive-review` alone needs the
optional vaderSentiment package.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from rlhfkit.data.loading import offline_error
from rlhfkit.judges.base import BasePairwiseJudge
from rlhfkit.judges.lm import LMPairwiseJudge
from rlhfkit.judges.scored import RewardModelJudge, RuleJudge
from rlhfkit.rewards.reward_models import folder_tokenizer
from rlhfkit.tasks import get_task, task_names, text_task_names


def rule_judge_names() -> list[str]:
    """Names `load_judge` accepts as built-in rule judges: the built-in tasks, judged by their reward."""
    return text_task_names()


def check_judge_model(judge_model: str | None, flag: str = "--judge_model") -> Path | None:
    """Refuse a missing or unknown `judge_model` (a ValueError naming `flag` and the choices) without
    loading anything; return its folder, or None for a built-in rule judge."""
    names = rule_judge_names()
    if not judge_model:
        raise ValueError(
            f"{flag} is required: a local causal LM folder, a local reward-model folder or one of "
            f"the built-in rule judges ({', '.join(names)})"
        )
    path = Path(judge_model).expanduser()
    if path.exists():
        return path
    if judge_model in names:
        return None
    if judge_model in task_names():  # a task scored against its dataset's columns: say which and why
        try:
            get_task(judge_model).text_reward(flag, "a rule judge")
        except ValueError as err:
            raise ValueError(f"{err}; the built-in rule judges are: {', '.join(names)}") from err
    close = difflib.get_close_matches(judge_model, names, n=1)
    guess = f"Did you mean {close[0]!r}? " if close else ""
    hint = (
        f"{guess}Pass a local causal LM folder, a local reward-model folder (sequence classification, "
        f"one output) or a built-in rule judge: {', '.join(names)}"
    )
    raise offline_error(flag, judge_model, hint, kind="folder or built-in judge")


def _own_tokenizer(path: Path, fallback: Any, trust_remote_code: bool) -> Any:
    """The folder's tokenizer when it ships one, else `fallback` (the policy's)."""
    tokenizer = folder_tokenizer(path, trust_remote_code)
    if tokenizer is not None:
        return tokenizer
    if fallback is None:
        raise ValueError(
            f"judge model folder {str(path)!r} has no tokenizer and no policy tokenizer was given"
        )
    return fallback


def load_judge(
    judge_model: str | None,
    tokenizer: Any = None,
    *,
    device: Any = "cpu",
    dtype: Any = "auto",
    trust_remote_code: bool = False,
    flag: str = "--judge_model",
) -> BasePairwiseJudge:
    """The pairwise judge that `judge_model` names; `tokenizer` (the policy's) serves a folder without one.

    A folder whose config names a `...ForSequenceClassification` architecture is a reward model
    (`RewardModelJudge`); any other model folder is read as a causal LM judge (`LMPairwiseJudge`).
    """
    path = check_judge_model(judge_model, flag)
    if path is None:
        try:
            return RuleJudge.of_texts(get_task(judge_model).reward)
        except ValueError as err:  # a reward that needs an optional package: its install hint
            raise ValueError(f"{flag} {judge_model!r}: {err.__cause__ or err}") from err
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    if not (path / "config.json").is_file():
        raise ValueError(f"{flag} {judge_model!r} is a path but not a model folder (no config.json)")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    options = {"trust_remote_code": trust_remote_code, "dtype": dtype}
    judge_tokenizer = _own_tokenizer(path, tokenizer, trust_remote_code)
    if any(arch.endswith("ForSequenceClassification") for arch in config.architectures or []):
        model = AutoModelForSequenceClassification.from_pretrained(path, **options).to(device)
        return RewardModelJudge(model, judge_tokenizer)
    if config.is_encoder_decoder:
        raise ValueError(
            f"{flag} {judge_model!r} is an encoder-decoder model; the LM judge needs a causal LM"
        )
    model = AutoModelForCausalLM.from_pretrained(path, **options).to(device)
    return LMPairwiseJudge(model, judge_tokenizer)
