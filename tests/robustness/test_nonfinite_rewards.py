"""One non-finite reward policy for every trainer: NaN, inf, all-None and overflowing rewards skip the update
(counted, warned about by cause, NonFiniteError after `max_consecutive_nonfinite_steps` in a row); a reward
that is not a number is a TypeError naming the function and the row; `rlhfkit grpo` fails in one line and
never prints NaN in its JSON summary."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from rlhfkit.core.advantages import group_advantages
from rlhfkit.rewards.scoring import RewardScorer
from rlhfkit.tasks import toy_prompt_dataset
from rlhfkit.testing import tiny_model, tiny_model_path, tiny_tokenizer
from rlhfkit.trainers.common.guards import NonFiniteError, NonFiniteGuard, NonFiniteStepWarning
from rlhfkit.trainers.grpo.config import GRPOConfig
from rlhfkit.trainers.grpo.trainer import GRPOTrainer
from rlhfkit.trainers.rloo.config import RLOOConfig
from rlhfkit.trainers.rloo.trainer import RLOOTrainer

NAN, INF = float("nan"), float("inf")


class _Reward:
    """Distinct scores 0, 1, 2, ... (every group has a spread, so a healthy update moves the weights), but
    `bad(n)` for each completion on the given (1-based) calls; `bad` gets the number of completions."""

    def __init__(self, bad, bad_calls=range(1, 1000), name="bad_reward"):
        self.bad, self.bad_calls, self.calls, self.__name__ = bad, set(bad_calls), 0, name

    def __call__(self, completions, **columns):
        self.calls += 1
        if self.calls in self.bad_calls:
            return self.bad(len(completions))
        return [float(i % 4) for i in range(len(completions))]


def _grpo(tmp_path, reward, **kwargs) -> GRPOTrainer:
    config = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=5, max_steps=3, logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=3, learning_rate=1e-3,
    )  # fmt: skip
    return GRPOTrainer(
        tiny_model("llama"),
        reward,
        args=GRPOConfig(**{**config, **kwargs}),
        train_dataset=toy_prompt_dataset(n=16),
        processing_class=tiny_tokenizer(padding_side="left"),
    )


def _rloo(tmp_path, reward, **kwargs) -> RLOOTrainer:
    config = dict(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, per_device_train_batch_size=4,
        rloo_k=2, num_ppo_epochs=1, response_length=4, total_episodes=12, logging_steps=1, save_strategy="no",
        num_sample_generations=0, disable_tqdm=True, seed=3, learning_rate=1e-3,
        local_rollout_forward_batch_size=64,
    )  # fmt: skip
    return RLOOTrainer(
        RLOOConfig(**{**config, **kwargs}),
        tiny_tokenizer(padding_side="left"),
        tiny_model("llama"),
        tiny_model("llama"),
        reward,
        toy_prompt_dataset(n=16),
    )


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _train_recording_moves(trainer, model):
    """Train; returns, per update, whether any parameter moved, and the warnings raised."""
    before = []

    class _Snapshot(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            before.append(_params(model))

    trainer.add_callback(_Snapshot())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    after = before[1:] + [_params(model)]
    moved = [any(not torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(before, after)]
    return moved, [str(w.message) for w in caught if issubclass(w.category, NonFiniteStepWarning)]


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


# ---------------------------------------------------------------------------------------------- GRPO
@pytest.mark.parametrize(
    "bad, cause",
    [
        (lambda n: [NAN] * n, r"reward function 'bad_reward' returned NaN or inf for 8 of 8"),
        (lambda n: [INF] + [0.0] * (n - 1), r"reward function 'bad_reward' returned NaN or inf for 1 of 8"),
        (lambda n: [None] * n, r"no usable reward"),
        (lambda n: [1e38, 0.0] * (n // 2), r"non-finite advantages"),
    ],
    ids=["all-nan", "one-inf", "all-none", "1e38"],
)
def test_grpo_bad_rewards_skip_the_update_count_it_and_name_the_cause(tmp_path, bad, cause):
    reward = _Reward(bad, bad_calls={2})
    trainer = _grpo(tmp_path, reward, max_steps=3)
    moved, said = _train_recording_moves(trainer, trainer.model)
    assert moved == [True, False, True]  # the parameters stay as they were on the skipped update only
    assert trainer.nonfinite_guard.skipped == 1
    assert _logged(trainer, "skipped_nonfinite_steps") == [0, 1, 1]
    assert any("skipped step 2: " in m for m in said), said
    assert any(re.search(cause, m) for m in said), said


@pytest.mark.parametrize(
    "bad", [lambda n: [NAN] * n, lambda n: [None] * n, lambda n: [-INF] * n], ids=["nan", "none", "inf"]
)
def test_grpo_bad_rewards_every_step_stop_after_the_limit(tmp_path, bad):
    trainer = _grpo(tmp_path, _Reward(bad), max_steps=8, max_consecutive_nonfinite_steps=2)
    start = _params(trainer.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        with pytest.raises(NonFiniteError, match="2 training steps in a row had"):
            trainer.train()
    assert trainer.nonfinite_guard.skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(start, _params(trainer.model)))


def test_grpo_all_none_warns_like_trl(tmp_path):
    trainer = _grpo(tmp_path, _Reward(lambda n: [None] * n), max_steps=1)
    with pytest.warns(UserWarning, match="every reward function returned None"):
        trainer.train()
    assert trainer.nonfinite_guard.skipped == 1


def test_grpo_some_none_rows_still_train(tmp_path):
    reward = _Reward(lambda n: [None, 1.0, 0.0, 2.0] * (n // 4), bad_calls={1, 2})
    trainer = _grpo(tmp_path, reward, max_steps=2)
    moved, _ = _train_recording_moves(trainer, trainer.model)
    assert moved == [True, True] and trainer.nonfinite_guard.skipped == 0


@pytest.mark.parametrize(
    "value, shown",
    [("7", "str '7'"), (True, "bool True"), ([1.0], "list [1.0]"), (np.bool_(True), "bool np.True_")],
    ids=["str", "bool", "list", "numpy-bool"],
)
def test_grpo_reward_that_is_not_a_number_is_a_type_error(tmp_path, value, shown):
    trainer = _grpo(tmp_path, _Reward(lambda n: [0.5] * (n - 1) + [value], name="seven"), max_steps=1)
    start = _params(trainer.model)
    with pytest.raises(TypeError, match=rf"reward function 'seven' returned {re.escape(shown)} for row 7"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(start, _params(trainer.model)))


# ---------------------------------------------------------------------------------------------- RLOO
@pytest.mark.parametrize(
    "bad",
    [
        lambda n: [NAN] * n,
        lambda n: [None] * n,
        lambda n: [INF] + [0.0] * (n - 1),
        lambda n: [1e38, 0.0] * (n // 2),
    ],
    ids=["all-nan", "all-none", "one-inf", "1e38"],
)
def test_rloo_bad_rewards_skip_the_update_and_count_it(tmp_path, bad):
    trainer = _rloo(tmp_path, _Reward(bad, bad_calls={2}))
    moved, said = _train_recording_moves(trainer, trainer.policy)
    assert moved == [True, False, True]
    assert trainer.nonfinite_guard.skipped == 1 and any("skipped step 2" in m for m in said), said


def test_rloo_reward_that_is_not_a_number_is_a_type_error(tmp_path):
    trainer = _rloo(tmp_path, _Reward(lambda n: ["7"] * n, bad_calls={1}, name="seven"))
    with pytest.raises(TypeError, match="reward function 'seven' returned str '7' for row 0"):
        trainer.train()


# ---------------------------------------------------------------------------------------------- the parts
def test_scorer_checks_each_value_and_keeps_none_and_numbers():
    def mixed(completions):
        return [1, 2.5, None, np.float32(0.5), np.int64(3), torch.tensor(4.0)]

    scores, per_source = RewardScorer(mixed, tokenizer=None).score_texts(["p"] * 6, ["c"] * 6)
    assert scores[2].isnan() and torch.equal(scores[[0, 1, 3, 4, 5]], torch.tensor([1, 2.5, 0.5, 3, 4]))

    def words(completions):
        return ["7"] * len(completions)

    with pytest.raises(TypeError, match=r"function 'words' returned str '7' for row 0 \(completion 'c'\)"):
        RewardScorer(words, tokenizer=None).score_texts(["p"], ["c"])


def test_scorer_warns_when_no_reward_function_applies_to_a_row():
    scorer = RewardScorer([lambda c: [None, 1.0], lambda c: [None, None]], tokenizer=None)
    with pytest.warns(UserWarning, match=r"every reward function returned None for 1 of 2 rows \(0\)"):
        scores, _ = scorer.score_texts(["p", "q"], ["a", "b"])
    assert scores[0].isnan() and scores[1] == 1.0


def test_guard_counts_a_named_problem_like_a_non_finite_value():
    guard = NonFiniteGuard(2)
    with pytest.warns(NonFiniteStepWarning, match="skipped step 1: no usable reward; no optimizer update"):
        assert not guard.check(step=1, problem="no usable reward", loss=torch.tensor(0.0))
    with pytest.warns(NonFiniteStepWarning):
        assert not guard.check(step=2, problem="no usable reward")
    with pytest.raises(NonFiniteError, match=r"2 training steps in a row had no usable reward\. "):
        guard.fail()
    assert guard.check(step=3, problem=None, loss=torch.tensor(1.0)) and guard.consecutive == 0


def test_group_advantages_keep_overflow_visible_and_absent_rewards_at_zero():
    huge = group_advantages(torch.tensor([1e38, 0.0, 1e38, 0.0]), 4)
    assert not torch.isfinite(huge).all()  # float32 std overflows: never a silent zero advantage
    assert not torch.isfinite(group_advantages(torch.tensor([INF, 0.0, 1.0, 2.0]), 4)).all()
    absent = group_advantages(torch.tensor([1.0, NAN, 3.0, NAN, NAN, NAN, 5.0, NAN]), 4)
    assert torch.isfinite(absent).all() and absent[[1, 3, 4, 5, 6, 7]].eq(0).all()


# ---------------------------------------------------------------------------------------------- command
TINY_RUN = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
            "--report_to", "none", "--use_cpu", "--logging_steps", "1", "--save_strategy", "no",
            "--disable_tqdm", "true"]  # fmt: skip


def _command_files(tmp_path, body):
    (tmp_path / "nan_rewards.py").write_text(f"def reward(completions, **columns):\n    {body}\n")
    Dataset.from_dict({"prompt": ["the film was", "a story about"] * 4}).to_json(str(tmp_path / "data.jsonl"))
    return ["--model_name_or_path", str(tiny_model_path("llama")), "--dataset_name",
            str(tmp_path / "data.jsonl"), "--output_dir", str(tmp_path / "run"), "--reward_funcs",
            "nan_rewards.reward", *TINY_RUN]  # fmt: skip


def test_grpo_command_summary_is_json_without_nan(tmp_path, capsys, monkeypatch):
    from rlhfkit.commands.grpo import main

    args = _command_files(tmp_path, "return [float('nan')] * len(completions)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteStepWarning)
        code = main([*args, "--max_steps", "1", "--max_consecutive_nonfinite_steps", "2"])
    assert code == 0  # one skipped update, under the limit
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the JSON summary: {line}"))
    assert summary["updates"] == 1 and summary["last_reward"] is None


@pytest.mark.slow
def test_grpo_command_with_a_nan_reward_fails_in_one_line(tmp_path):
    args = _command_files(tmp_path, "return [float('nan')] * len(completions)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RLHFKIT_DEBUG", None)
    flags = ["--max_steps", "8", "--max_consecutive_nonfinite_steps", "2"]
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit", "grpo", *args, *flags],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("rlhfkit grpo: error:")]
    assert len(errors) == 1 and "2 training steps in a row had" in errors[0], result.stderr[-3000:]
    assert "reward function 'reward' returned NaN or inf" in errors[0]
    assert "Traceback" not in result.stderr
    assert "updates" not in result.stdout  # no summary: the run did not finish
